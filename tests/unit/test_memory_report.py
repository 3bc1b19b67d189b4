"""What a rank's memory costs, as the summary records it: ``smaps_rollup`` parsed
(``gtopk.train.memory``), carried on a rank's last row (``gtopk.train.rows.RankRows.
end_of_job``) and summarised as the rank with the most private memory
(``gtopk.records.summary``); absent where there is no ``/proc``. And what was cut:
torchvision not imported by a rank that reads no data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gtopk.records.summary import memory_fields, package_version, summarize
from gtopk.train import memory
from gtopk.train.rows import RankRows

#: a smaps_rollup as Linux 6.x writes it (the numbers made up, in kB)
ROLLUP = """\
55d0c0a00000-7ffd1c3f1000 ---p 00000000 00:00 0                          [rollup]
Rss:              921600 kB
Pss:              700416 kB
Pss_Dirty:        600000 kB
Pss_Anon:         600000 kB
Pss_File:         100416 kB
Pss_Shmem:             0 kB
Shared_Clean:     307200 kB
Shared_Dirty:      10240 kB
Private_Clean:     20480 kB
Private_Dirty:    583680 kB
Referenced:       921600 kB
Anonymous:        594000 kB
KSM:                   0 kB
LazyFree:              0 kB
AnonHugePages:     40960 kB
ShmemPmdMapped:        0 kB
FilePmdMapped:         0 kB
Shared_Hugetlb:        0 kB
Private_Hugetlb:       0 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
"""

ROW = {"t_data": 0.0, "t_compute": 0.1, "t_compr": 0.01, "t_commu": 0.02, "t_update": 0.005, "t_iter": 0.14}
ROW |= {"bytes_sent": 1, "bytes_recv": 1, "t_check": 0.005}


def test_a_rollup_splits_into_private_pss_and_rss():
    got = memory.parse_smaps_rollup(ROLLUP)
    assert got == {"mem_private_mb": 590.0, "mem_pss_mb": 684.0, "mem_rss_mb": 900.0}


def test_a_rollup_without_the_private_fields_is_refused():
    text = "\n".join(ln for ln in ROLLUP.splitlines() if not ln.startswith("Private_Dirty"))
    with pytest.raises(ValueError, match="Private_Dirty"):
        memory.parse_smaps_rollup(text)


def test_rank_memory_reads_the_rollup_and_is_empty_without_one(tmp_path, monkeypatch):
    path = tmp_path / "smaps_rollup"
    path.write_text(ROLLUP)
    monkeypatch.setattr(memory, "SMAPS_ROLLUP", str(path))
    assert memory.rank_memory()["mem_private_mb"] == 590.0
    monkeypatch.setattr(memory, "SMAPS_ROLLUP", str(tmp_path / "absent"))  # macOS: no /proc
    assert memory.rank_memory() == {}


def test_this_process_rollup_is_consistent_where_linux_has_one():
    got = memory.rank_memory()
    if not got:
        pytest.skip("no /proc/self/smaps_rollup here")
    assert 0 < got["mem_private_mb"] <= got["mem_pss_mb"] <= got["mem_rss_mb"]


def test_the_end_of_job_facts_go_on_the_last_row_only(tmp_path):
    rows = RankRows(tmp_path, 0)
    try:
        rows.end_of_job({"mem_private_mb": 1.0})  # no row yet: nothing to carry them
        for it in range(2):
            rows.write(dict(ROW, iter=it), attempt=1)
        rows.end_of_job({"mem_private_mb": 590.0, "mem_pss_mb": 684.0, "mem_rss_mb": 900.0})
    finally:
        rows.close()
    assert "mem_private_mb" not in rows.rows[0] and rows.rows[1]["mem_private_mb"] == 590.0
    assert "mem_private_mb" not in (tmp_path / "iters.rank0.jsonl").read_text()  # the file keeps the steps


def test_the_summary_takes_the_rank_with_most_private_memory():
    ranks = [
        dict(ROW, iter=4, rank=0, mem_private_mb=590.0, mem_pss_mb=684.0, mem_rss_mb=900.0),
        dict(ROW, iter=4, rank=1, mem_private_mb=600.0, mem_pss_mb=700.0, mem_rss_mb=905.0),
    ]
    s = summarize([dict(ROW, iter=3, rank=0), *ranks], {"params": 10, "mode": "benchmark"}, 32)
    assert (s["mem_private_mb"], s["mem_shared_mb"], s["mem_pss_mb"]) == (600.0, 305.0, 700.0)


def test_the_summary_counts_a_skipped_last_step_and_has_no_keys_without_proc():
    last = dict(ROW, iter=1, nonfinite="skip", mem_private_mb=10.0, mem_pss_mb=12.0, mem_rss_mb=30.0)
    s = summarize([dict(ROW, iter=0), last], {"params": 10, "mode": "benchmark"}, 32)
    assert (s["mem_private_mb"], s["mem_shared_mb"]) == (10.0, 20.0)
    s = summarize([dict(ROW, iter=0)], {"params": 10, "mode": "benchmark"}, 32)
    assert not {"mem_private_mb", "mem_shared_mb", "mem_pss_mb"} & set(s)
    assert memory_fields([]) == {}


def test_a_package_version_is_read_without_importing_it(tmp_path, monkeypatch):
    (tmp_path / "gtopkfakepkg").mkdir()
    (tmp_path / "gtopkfakepkg" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (tmp_path / "gtopkfakepkg" / "version.py").write_text("__version__ = '1.2.3+cu999'\ngit_version = 'x'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert package_version("gtopkfakepkg") == "1.2.3+cu999" and "gtopkfakepkg" not in sys.modules
    assert package_version("gtopk_no_such_package") is None


def test_a_rank_that_reads_no_data_imports_no_torchvision():
    code = (
        "import sys, gtopk.train.worker, gtopk.train.loop, gtopk.records.summary, gtopk.simulated.ranks\n"
        "from gtopk.records.summary import environment\n"
        "environment('cpu', 'gloo')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchvision'))\n"
    )
    root = Path(__file__).resolve().parents[2]  # this tree's gtopk, wherever pytest runs from
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "[]"


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024.0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_job_does_not_count_the_heap_an_earlier_job_freed():
    """Memory freed in the middle of the C heap stays resident (glibc returns only its top):
    a worker's next job would count it in its RSS and private pages. ``reset_peak_rss``
    trims the heap first, so the freed pages leave the RSS and the restarted peak."""
    if not memory.release_free_memory():
        pytest.skip("no glibc malloc_trim")
    chunk, count = 48 * 1024, 2000  # below malloc's mmap threshold: on the heap (~94 MiB)
    blocks = [bytearray(b"x" * chunk) for _ in range(count)]
    keep = blocks[-1]  # the heap's top stays in use, so free() cannot give the rest back
    freed_mb = chunk * (count - 1) / 2**20
    del blocks
    held = _rss_mb()
    assert memory.reset_peak_rss()
    after = _rss_mb()
    assert held - after > 0.5 * freed_mb, (held, after, freed_mb)
    assert memory.peak_rss_mb() < held - 0.5 * freed_mb
    assert len(keep) == chunk
