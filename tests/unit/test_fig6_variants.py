"""A reducer at other settings than its yaml's (the sampled threshold) in Fig. 6, Table IV and
the breakdown: a line, column and bar of its own by its label (``analysis.figures.fig6.labelled``),
its speedup over the same reducer at the yaml's settings (``table4.default_pairs``), and the
sweep that runs it (``analysis.reproduce.variant_sweeps``)."""

from __future__ import annotations

import pandas as pd

from analysis import reproduce
from analysis.figures import fig6, table4
from analysis.reducers import conf_reducers


def resolved(name: str, **settings) -> dict:
    """``conf/reducer/<name>.yaml`` as a job resolves it (density 0.001), ``settings`` over it."""
    return {**conf_reducers()[name], "density": 0.001, **settings}


def test_a_setting_other_than_the_yamls_is_a_label_of_its_own():
    jobs = pd.DataFrame(
        {
            "reducer": ["gtopk", "gtopk", "oktopk", "ddp"],
            "reducer_cfg": [resolved("gtopk"), resolved("gtopk", selection="sampled"), resolved("oktopk"), {}],
        }
    )
    assert list(fig6.labelled(jobs)["reducer"]) == ["gtopk", "gtopk selection=sampled", "oktopk", "ddp"]
    assert list(jobs["reducer"]) == ["gtopk", "gtopk", "oktopk", "ddp"]  # the caller's frame is left as it was


def test_table4_pairs_a_variant_with_its_reducer_and_keeps_a_plain_subject():
    names = ["dense", "gtopk", "gtopk selection=sampled", "oktopk", "ddp"]
    pairs = table4.default_pairs(names)
    subject = pairs[0][0]
    assert " " not in subject and all(num == subject for num, _ in pairs[: len(names) - 1])
    assert ("gtopk selection=sampled", "gtopk") in pairs
    without = table4.default_pairs(["dense", "gtopk", "gtopk selection=sampled", "ddp"])
    assert without[0][0] == "gtopk" and ("gtopk selection=sampled", "gtopk") in without


def test_the_variant_sweep_runs_over_the_reducers_that_have_the_setting():
    base = ["experiment=fig6_reproduce", "model=resnet20", "reducer=dense,gtopk,oktopk,ddp"]
    (sweep,) = reproduce.variant_sweeps(base, [("selection", "sampled")])
    having = [r for r in ("dense", "gtopk", "oktopk", "ddp") if "selection" in conf_reducers()[r]]
    assert sweep == ["experiment=fig6_reproduce", "model=resnet20", f"reducer={','.join(having)}"] + [
        "reducer.selection=sampled"
    ]
    assert reproduce.variant_sweeps(["experiment=fig6_reproduce", "reducer=dense,ddp"]) == []
    assert reproduce.variant_sweeps(base, []) == []


def test_the_v1_jobs_are_the_reference_baselines_p1_jobs_where_the_sweep_lacks_them():
    """The experiment's own sweep (no reducer or nodes given) is the paper's three methods at
    P = 1, 4, 8: the v_1 jobs are DDP's at P = 1, over the same models; none where DDP is
    swept already or where the sweep has no P = 1 (FULL's P = 16, 32, the baselines' 2, 4, 8)."""
    (v1,) = reproduce.v1_sweep(["experiment=fig6_reproduce", "model=resnet20,vgg16"])
    assert v1 == ["experiment=fig6_reproduce", "model=resnet20,vgg16", "nodes=1", "reducer=ddp"]
    assert reproduce.axis(v1, "model") == ["resnet20", "vgg16"] and reproduce.axis(v1, "nodes") == ["1"]
    assert "ddp" not in reproduce.axis(["experiment=fig6_reproduce"], "reducer")
    assert reproduce.v1_sweep(["experiment=fig6_reproduce", "reducer=dense,ddp"]) == []
    assert reproduce.v1_sweep(["experiment=fig6_reproduce", "nodes=16"]) == []
    assert reproduce.v1_sweep(["experiment=fig6_baselines"]) == []
