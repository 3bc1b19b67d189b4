"""Whether this machine can build the emulated cluster is decided by trying
(``netns.unavailable_reason``): the verdict agrees with what building it does here, and a
failing ``ip`` gives a one-line reason naming the command, after which
``make reproduce-*`` falls back to ``cluster=local``."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

from gtopk.run.cluster import EmulatedCluster, netns

ROOT = Path(__file__).resolve().parents[2]


def test_probe_agrees_with_building_the_emulated_cluster():
    reason = netns.unavailable_reason()
    job = f"{netns.PREFIX}{os.getpid()}x{secrets.token_hex(3)}"
    names = [f"{job}-sw", f"{job}-r0", f"{job}-r1"]
    built, error = True, None
    try:  # the emulated cluster's own commands for two ranks, without its check
        for ns, (ip, tc) in EmulatedCluster()._commands(job, 2).items():
            netns.run_batch("ip", ip, ns)
            netns.run_batch("tc", tc, ns)
    except (netns.NetnsError, OSError) as e:
        built, error = False, e
    finally:
        if reason is None or built:
            netns.delete(names)
    assert built == (reason is None), f"probe says {reason!r}, building gave {error!r}"
    assert not set(names) & set(netns.existing())
    assert not [n for n in netns.existing() if n.startswith(f"{netns.PREFIX}{os.getpid()}x")]  # no probe left


def test_failing_ip_gives_its_error_as_reason_and_reproduce_falls_back_to_local(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "ip-calls"
    (fake / "ip").write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\necho "RTNETLINK answers: Operation not permitted" >&2\nexit 2\n'
    )
    (fake / "ip").chmod(0o755)
    (fake / "tc").write_text("#!/bin/sh\nexit 0\n")
    (fake / "tc").chmod(0o755)
    code = (
        "from gtopk.run.cluster.netns import unavailable_reason\n"
        "from analysis.reproduce import pick_cluster\n"
        "print(unavailable_reason())\n"
        "print(pick_cluster(['model=vgg16']))\n"
        "assert unavailable_reason() is not None\n"
    )
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ.get('PATH', '')}")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    reason, overrides = proc.stdout.splitlines()
    assert reason.startswith("`ip netns add ") and reason.endswith("failed: RTNETLINK answers: Operation not permitted")
    assert overrides == "['model=vgg16', 'cluster=local']"
    assert "cannot emulate" in proc.stderr and "Operation not permitted" in proc.stderr
    tried = [line for line in calls.read_text().splitlines() if line.startswith("netns add ")]
    assert len(tried) == 1, f"three asks, one probe per process: {tried}"
