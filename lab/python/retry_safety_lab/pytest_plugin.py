"""The pytest plugin (entry point `pytest11`): the `retry_safety_lab` fixture starts proxies;
right after the test body their counts are read, and the test FAILS (not errors) when one
counted a write applied twice or no write at all. Every proxy is stopped whatever happens."""

import pytest

from .errors import LabError, LabFailed
from .proxy import Proxy
from .upstream import Upstream

_PROXIES = pytest.StashKey[list]()


def _stop_all(item, check):
    """Stops the test's proxies; the first failure, if `check`, as the test's."""
    failures = []
    for proxy in item.stash.get(_PROXIES, []):
        try:
            if check:
                proxy.check()
            else:
                proxy.stop()
        except (LabError, LabFailed) as err:
            failures.append(str(err))
    item.stash[_PROXIES] = []
    if check and failures:
        pytest.fail("\n".join(failures), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    try:
        result = yield
    except BaseException:
        _stop_all(item, check=False)  # the test's own failure is the one reported
        raise
    _stop_all(item, check=True)
    return result


@pytest.fixture
def retry_safety_lab(request):
    """`retry_safety_lab(upstream_url, faults=..., writes=[...])` starts a proxy in front of
    the upstream and returns it (`.url`); options as `retry_safety_lab.Proxy`'s."""
    proxies = request.node.stash.setdefault(_PROXIES, [])

    def start(upstream, **options):
        proxy = Proxy(upstream, **options).start()
        proxies.append(proxy)
        return proxy

    yield start
    # Stopped already unless the test body never ran (a later fixture failed to set up).
    _stop_all(request.node, check=False)


@pytest.fixture
def retry_safety_lab_upstream():
    """The URL of the lab's own upstream (`retry-safety-lab serve`, honouring Idempotency-Key)."""
    with Upstream() as upstream:
        yield upstream.url
