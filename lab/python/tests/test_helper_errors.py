# The helper's bad inputs, each a clear error and no process left behind (run by
# scripts/test-lab-packages.sh against the installed wheel, with `-p pytester`).
import os
import socket
import sysconfig

import pytest

import retry_safety_lab
from retry_safety_lab import LabError, LabFailed, Proxy, Upstream


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_missing_binary_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sysconfig, "get_path", lambda *a, **k: str(tmp_path))
    with pytest.raises(LabError, match="pip install retry-safety-lab"):
        retry_safety_lab.find_binary()
    monkeypatch.setenv("RETRY_SAFETY_LAB_BIN", str(tmp_path / "nothing"))
    with pytest.raises(LabError, match="RETRY_SAFETY_LAB_BIN"):
        Proxy("http://127.0.0.1:1").start()


def test_an_upstream_that_does_not_answer_is_named():
    with pytest.raises(LabError, match="--upstream.*unreachable.*start the upstream"):
        Proxy(f"http://127.0.0.1:{free_port()}").start()


def test_a_port_in_use_is_named():
    with Upstream() as upstream, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LabError, match="--listen.*pass another listen="):
            Proxy(upstream.url, listen=f"127.0.0.1:{port}").start()


def test_a_run_that_reached_nothing_fails_and_leaves_no_process():
    with Upstream() as upstream:
        with pytest.raises(LabFailed, match="no write reached the lab"):
            with Proxy(upstream.url) as lab:
                pid = lab._process.child.pid
    assert gone(pid)


def test_the_block_s_own_error_wins_and_the_proxy_stops():
    with Upstream() as upstream:
        with pytest.raises(KeyError):
            with Proxy(upstream.url) as lab:
                pid = lab._process.child.pid
                raise KeyError("the SDK's own bug")
    assert gone(pid)
    assert lab.report.writes == 0


def test_a_failing_test_stops_the_fixture_s_proxy(pytester):
    pytester.makepyfile(
        """
        def test_boom(retry_safety_lab, retry_safety_lab_upstream):
            lab = retry_safety_lab(retry_safety_lab_upstream)
            open("pid", "w").write(str(lab._process.child.pid))
            raise RuntimeError("the SDK's own bug")
        """
    )
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*RuntimeError: the SDK's own bug*"])
    assert gone(int((pytester.path / "pid").read_text()))


def test_a_lab_never_stopped_does_not_outlive_python():
    import subprocess
    import sys
    import time

    started = subprocess.run(
        [sys.executable, "-c", "from retry_safety_lab import Upstream; print(Upstream().start()._process.child.pid)"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    pid = int(started.stdout)
    for _ in range(50):
        if gone(pid):
            break
        time.sleep(0.1)
    assert gone(pid)
