#!/bin/bash
# H200 run 22 call 2 (session 21; carry [".whl", ".jit"]; prologue as call 1's):
# (1) tests/worker/test_gpu_extend_behind.py (new case: enqueue_extend returns while the device is busy) and
#     tests/worker/test_gpu_host_waits.py (new: the draw and the penalties do not wait for the device);
# (2) bench/l2_prefetch_bench.py (new): the decode step's projections with the next one's weights read into L2 on a
#     side stream of the same graph, against without (1B: M = 64, 1, 256; no attention stand-in and 37.7 MB of KV);
# (2b) the same in the model's decode graphs (worker_svc/model/l2_prefetch.py, new in session 22): worker bench 1B
#     B = 1 / 64, --l2-prefetch-rows 64 with distance 1 and 2 against off;
# (3) worker bench 1B B = 64 K = 8 sampled (--temperature 0.7, top_k 50): the draw as now (small tensors through
#     pinned memory, the noise in one kernel, no sort without filters, topk of the k_max first with top_k) / made with
#     torch.tensor(..., device=cuda) and a noise kernel a row (sampler_sync.py: the host waited) / pinned, a kernel a
#     row (sampler_pinned.py);
# (4) the Triton decode attention's KV splits in the graph (worker bench B = 64, --attn-splits 6 / 12 / 4 against
#     decode_config's 9: 576 CTAs are ~1.45 waves at 3 CTAs an SM, 384 one);
# (5) serve_bench 1B c64 --rounds 2: the sampling rows of an extend launched behind indexed with a device tensor
#     (this session) / with a Python list (extend_behind_listindex.py swapped in: the host waited for the stream),
#     alternated while time is left.
mkdir -p /tmp/r
TS=$(date +%s)  # the call's start: nothing new starts after 540 s of it
T0=$(date +%s)
ok() { [ $(( $(date +%s) - TS )) -lt ${1:-540} ]; }
left() { [ $(( $(date +%s) - T0 )) -lt $1 ]; }
pack() { tar czf $OUT/json.tgz -C /tmp/r .; }
kill_stack() { pkill -9 -f "worker_svc|scheduler_svc|cache_svc|gateway|launcher"; sleep 1; }
find /tmp/site/flashinfer /tmp/site/tvm_ffi -exec touch -h -d '2020-01-01 00:00' {} +
[ -d .jit ] && cat .jit/jit.part* | tar xzf - -C ~ && echo "jit cache restored"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ ! -d .jit ]; then  # a fresh checkout has no JIT cache: build it (as call 1) and return it as $OUT/jit.part*
  timeout 300 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --batches 1,64 --prefill 16,1024 \
    --iters 1 --decode-steps 8 > /tmp/r/warm.txt 2>&1; tail -3 /tmp/r/warm.txt
  (cd ~ && tar czf /tmp/jit.tgz .cache/flashinfer .triton 2>/dev/null) && split -b 15000000 -d /tmp/jit.tgz $OUT/jit.part
  T0=$(date +%s); echo "jit cache built; the timed part starts now"
fi
timeout 150 python3 -m pytest -o addopts="" -q -p no:warnings -rf tests/worker/test_gpu_extend_behind.py tests/worker/test_gpu_host_waits.py tests/worker/test_l2_prefetch.py > /tmp/r/test_gpu_extend_behind.txt 2>&1
tail -6 /tmp/r/test_gpu_extend_behind.txt; pkill -9 -f pytest; pack; echo "tests after $(( $(date +%s) - T0 )) s"
# (after the tests, not beside them: the survey times graph replays, which other kernels on the GPU would slow)
timeout 120 python3 -m bench.l2_prefetch_bench --shape starcoderbase-1b --rows 64,1,256 --out /tmp/r/l2_1b > /tmp/r/l2_1b.txt 2>&1
grep -v Warn /tmp/r/l2_1b.txt | tail -36; pack; echo "l2 after $(( $(date +%s) - T0 )) s"
P() { n=$1; shift; ok 480 || return; timeout 70 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 \
  --decode-steps 8 --batches 1,64 --prefill "" --json-out /tmp/r/p_$n.json "$@" > /tmp/r/p_$n.txt 2>&1; echo "$n:"; grep -E 'replay alone' /tmp/r/p_$n.txt; }
P off; P d1 --l2-prefetch-rows 64; P d2 --l2-prefetch-rows 64 --l2-prefetch-distance 2; P off2
pack; echo "prefetch A/B after $(( $(date +%s) - T0 )) s"
W() { ok 480 || return; n=$1; shift; timeout 70 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --decode-steps 8 \
  --batches 64 --prefill "" --temperature 0.7 --json-out /tmp/r/w_$n.json "$@" > /tmp/r/w_$n.txt 2>&1; grep -v Warn /tmp/r/w_$n.txt | tail -6; }
cp worker_svc/sampler.py /tmp/sampler_new.py
W sample_now; cp bench/results/h200-run22/sampler_sync.py worker_svc/sampler.py; W sample_sync
cp bench/results/h200-run22/sampler_pinned.py worker_svc/sampler.py; W sample_pinned; cp /tmp/sampler_new.py worker_svc/sampler.py
pack; echo "worker sampling A/B after $(( $(date +%s) - T0 )) s"
A() { ok 500 || return; n=$1; shift; timeout 45 python3 -m worker_svc.bench --shape starcoderbase-1b --dtype bfloat16 --context 1152 --decode-steps 8 \
  --batches 64 --prefill "" --json-out /tmp/r/a_$n.json "$@" > /tmp/r/a_$n.txt 2>&1; echo "$n: $(grep -E 'replay alone' /tmp/r/a_$n.txt)"; }
A splits_default; A splits6 --attn-splits 6; A splits12 --attn-splits 12; A splits4 --attn-splits 4
pack; echo "attention splits after $(( $(date +%s) - T0 )) s"
cp worker_svc/extend_behind.py /tmp/extend_behind_new.py
S() { n=$1; timeout 75 python3 -m bench.serve_bench --gpu --phases c64 --rounds 2 --out /tmp/r/$n > /tmp/r/$n.txt 2>&1
  kill_stack; rm -rf /tmp/r/$n/logs; grep -E "c64:" /tmp/r/$n.txt | cut -c1-160
  python3 -m bench.forward_timeline /tmp/r/$n/forwards.tsv --json /tmp/r/fwd_$n.json > /tmp/r/fwd_$n.txt; grep -A8 "^segment 1" /tmp/r/fwd_$n.txt
  pack; echo "$n after $(( $(date +%s) - T0 )) s"; }
ok 470 && S devidx1
ok 470 && cp bench/results/h200-run22/extend_behind_listindex.py worker_svc/extend_behind.py && S listidx1
cp /tmp/extend_behind_new.py worker_svc/extend_behind.py
ok 470 && S devidx2
ok 470 && cp bench/results/h200-run22/extend_behind_listindex.py worker_svc/extend_behind.py && S listidx2
cp /tmp/extend_behind_new.py worker_svc/extend_behind.py
echo "done after $(( $(date +%s) - T0 )) s"
