#!/usr/bin/env bash
# The checks of one lease of a GPU machine (docs/gpu.md), as one script so that a short lease
# is spent on measuring, not typing. Run from the repository root:
#   OUT=<folder> bash tests/gpu/lease.sh
# 1. `make test-gpu`'s tier (NCCL_DEBUG=INFO; a test that needs more GPUs than there are skips);
# 2. top-k selection and merge at the paper's four gradient sizes on CUDA;
# 3. P = 1 benchmark jobs through run.py with measured compute on CUDA, the paper's four
#    models x dense, Top-k, gTop-k, DDP (20 timed steps after 3 warm-up ones) at the
#    per-worker batch of $BATCH (default: the models' benchmark batch, the paper's);
# 4. the local compute profile of each model at that batch (compute.profile=local), to be
#    replayed elsewhere (compute.profile=<that json>);
# 5. training on CUDA twice with the same seed (digits, ResNet-20, 2 epochs; one rank, and
#    four simulated ranks): are the two runs' losses bit-identical, which ops warn?
# 6. the simulated workers (P ranks in one process, docs/simulated.md) on CUDA: the epoch
#    bench at P = 1..256 at 8 x 8 and 32 x 32 pixels, and the same machine's CPU (two
#    threads) at P = 4 and 32 for the ratio;
# 7. one cell of Fig. 5's whole recipe on CUDA (experiment=fig5_full, P = 32, gTop-k,
#    140 epochs; whatever epochs its time limit lets it finish are in its epochs.jsonl).
# 8. Fig. 5 at the paper's training length on CUDA (experiment=fig5_paper_length, 8 x 8 as the
#    CPU grid, device=cuda): the cells of $PL_CELLS in order, as many as $PAPER_S seconds allow
#    (default 540); a cell cut short resumes from its checkpoint on the next lease when $OUT's
#    paper_runs.tgz (checkpoints included) is unpacked at the repository root first. A P = 32 step
#    costs about 85 ms on an H200 (launch-bound, docs/gpu.md), so 9 minutes are ~6,000 of a
#    cell's 55,224 iterations.
# PARTS picks some (default: 1-5; e.g. PARTS="profile train", PARTS="tier simulated fig5", PARTS=paper).
# Each part has its own time limit and the next runs whatever it ended with; everything
# lands in $OUT (default runs/gpu/lease). It uses `python3` (the interpreter that has CUDA
# torch there) and, when .whl/ holds wheels, installs them first into /tmp/site (the
# packages that image lacks: hydra-core, omegaconf, antlr4, submitit and its launcher).
set -u
PARTS=${PARTS:-"tier selection jobs profile train"}
FIG5_S=${FIG5_S:-150}
BATCH=${BATCH:-'${model.batch_size.benchmark}'}
want() { [[ " $PARTS " == *" $1 "* ]]; }
out=${OUT:-runs/gpu/lease}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
    date -u
    nvidia-smi
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', \
torch.cuda.nccl.version(), torch.cuda.get_device_name(0), torch.cuda.device_count(), 'GPU(s)')"
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

if want tier; then
    echo "== 1. GPU tier"
    NCCL_DEBUG=INFO timeout 180 python3 -m pytest -q -rs -s -m gpu tests/gpu -p no:cacheprovider \
        >"$out/test_gpu.log" 2>&1
    echo "exit $?"; grep -E "passed|failed|error|SKIPPED" "$out/test_gpu.log" | tail -n 30
fi
if want selection; then
    echo "== 2. selection on CUDA"
    timeout 60 python3 -m tests.bench.selection_bench --device cuda --threads 1 --reps 30 \
        --json "$out/selection.json" 2>&1 | tee "$out/selection.txt"
fi
if want jobs; then
    echo "== 3. P = 1 jobs on CUDA"
    timeout 150 python3 run.py -m name=gpu nodes=1 device=cuda model=resnet20,vgg16,resnet50,alexnet \
        reducer=dense,topk,gtopk,ddp "batch_size=$BATCH" benchmark.warmup=3 benchmark.iters=20 \
        >"$out/jobs.log" 2>&1
    echo "exit $?"; grep -E "^done|did not" "$out/jobs.log"
fi
if want profile; then
    echo "== 4. compute profile on CUDA"
    timeout 70 python3 run.py -m name=gpu_profile nodes=1 device=cuda compute=replay compute.profile=local \
        model=resnet20,vgg16,resnet50,alexnet reducer=dense "batch_size=$BATCH" benchmark.iters=3 \
        >"$out/profile.log" 2>&1
    echo "exit $?"; grep -E "measuring|did not" "$out/profile.log"
    cp runs/profiles/local.json "$out/profile_local.json"
fi
if want train; then
    echo "== 5. training on CUDA, twice"
    for cluster in local:1 simulated:4; do
        for run in a b; do
            timeout 60 python3 run.py name=gpu_train mode=train data=digits model=resnet20 device=cuda \
                cluster=${cluster%:*} nodes=${cluster#*:} train.epochs=2 train.loader_workers=0 \
                data.image_size=8 batch_size=32 "hydra.run.dir=runs/gpu_train/${cluster%:*}_$run" \
                >"$out/train_${cluster%:*}_$run.log" 2>&1
            echo "${cluster%:*} $run exit $?"
        done
    done
    python3 - <<'PY' 2>&1 | tee "$out/train_identity.txt"
import json, pathlib
for c in ("local", "simulated"):
    rows = [[{k: e.get(k) for k in ("epoch", "train_loss", "test_loss", "test_top1")}
             for e in map(json.loads, pathlib.Path(f"runs/gpu_train/{c}_{r}/epochs.jsonl").read_text().splitlines())]
            for r in "ab"]
    print(c, "identical" if rows[0] == rows[1] else "DIFFERENT", rows[0][-1], rows[1][-1])
PY
    grep -h -i "determinis" "$out"/train_*.log | sort | uniq -c | head -n 20
fi
if want simulated; then
    echo "== 6. simulated workers on CUDA"
    for px in 8 32; do
        timeout 150 python3 -m tests.bench.simulated_epoch --nodes 1 4 16 32 256 --mode auto --epochs 4 --together \
            --image-size $px --device cuda 2>&1 | tee "$out/simulated_cuda_${px}px.txt"
    done
    timeout 120 python3 -m tests.bench.simulated_epoch --nodes 4 32 --mode auto --epochs 4 --together \
        --image-size 32 --device cpu --threads 2 2>&1 | tee "$out/simulated_cpu_32px.txt"
fi
if want fig5; then
    echo "== 7. one cell of fig5_full on CUDA (limit ${FIG5_S} s)"
    t0=$(date +%s.%N)
    timeout "$FIG5_S" python3 run.py experiment=fig5_full nodes=32 reducer=gtopk device=cuda logger.wandb=false \
        hydra.run.dir=runs/gpu_fig5/gtopk_p32 >"$out/fig5.log" 2>&1
    rc=$?; t1=$(date +%s.%N)
    echo "exit $rc after $(python3 -c "print(round($t1 - $t0, 1))") s, $(wc -l <runs/gpu_fig5/gtopk_p32/epochs.jsonl) epochs"
    tail -n 2 runs/gpu_fig5/gtopk_p32/epochs.jsonl 2>/dev/null
fi
if want paper; then
    echo "== 8. Fig. 5 at the paper's length on CUDA (limit ${PAPER_S:=540} s)"
    end=$(( $(date +%s) + PAPER_S ))
    for c in ${PL_CELLS:-32:gtopk:0 32:dense:0 32:gtopk_exact:0 32:topk:0}; do
        left=$(( end - $(date +%s) )); (( left > 30 )) || break
        p=${c%%:*}; rest=${c#*:}; r=${rest%%:*}; s=${rest#*:}
        timeout "$left" python3 run.py -m experiment=fig5_paper_length nodes=$p reducer=$r seed=$s device=cuda \
            logger.wandb=false >>"$out/paper.log" 2>&1
        echo "$c exit $? epochs $(cat runs/fig5_paper_length/*nodes=$p,reducer=$r,seed=$s*/epochs.jsonl 2>/dev/null | wc -l)"
    done
    tar czf "$out/paper_runs.tgz" runs/fig5_paper_length 2>/dev/null  # checkpoints too: the next lease resumes
fi
tar czf "$out/runs.tgz" --exclude='*.pt' runs/gpu runs/gpu_profile runs/profiles runs/gpu_train runs/gpu_fig5 \
    2>/dev/null
ls -la "$out"
