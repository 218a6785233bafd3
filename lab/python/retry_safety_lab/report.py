"""The proxy's counts (its `--json` report) and the failure message that names the routes."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Report:
    """What the proxy counted; `raw` is its JSON object (fields as in the lab's README)."""

    raw: dict

    @property
    def passed(self) -> bool:
        return bool(self.raw.get("pass"))

    @property
    def applied_twice(self) -> int:
        return int(self.raw.get("applied_twice", 0))

    @property
    def writes(self) -> int:
        return int(self.raw.get("writes", 0))

    @property
    def routes(self) -> list:
        return list(self.raw.get("routes", []))

    def message(self) -> str:
        """The verdict, then each route whose writes were applied twice, as the CLI's table
        says it."""
        lines = [f"retry-safety-lab: FAIL: {'; '.join(self.raw.get('failures', []))}"]
        for r in self.routes:
            if r.get("applied_twice"):
                lines.append(
                    f"  {r['route']}: {r['applied_twice']} of {r['operations']} writes may have "
                    f"been applied twice ({r['attempts']} attempts, {r['upstream_requests']} "
                    f"reached the upstream, {r['uncertain']} linked by content alone)"
                )
        return "\n".join(lines)
