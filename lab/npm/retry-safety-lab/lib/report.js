"use strict";
// The proxy's counts (its `--json` report) and the failure message that names the routes.

/** The verdict, then each route whose writes were applied twice, as the CLI's table says it. */
function failureMessage(report) {
  const lines = [`retry-safety-lab: FAIL: ${report.failures.join("; ")}`];
  for (const r of report.routes) {
    if (r.applied_twice > 0) {
      lines.push(
        `  ${r.route}: ${r.applied_twice} of ${r.operations} writes may have been applied twice ` +
          `(${r.attempts} attempts, ${r.upstream_requests} reached the upstream, ${r.uncertain} linked by content alone)`,
      );
    }
  }
  return lines.join("\n");
}

module.exports = { failureMessage };
