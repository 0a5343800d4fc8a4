#!/usr/bin/env bash
# Runs over several processes on this machine (Gloo on localhost; docs/DISTRIBUTED.md), each
# against the single-process run of the same job:
#   - streaming and layerwise calibration with --nproc 2 and 3 write byte-identical models
#     (minmax, percentile, kl_histogram; merged observer states give the same parameters);
#   - the same with the workers started as a standard launcher does (RANK, WORLD_SIZE, ...);
#   - GPTQ with the Hessians merged: the layers' output errors within 2% of one process's;
#   - QAT: the same epoch losses within summation-order tolerance, one checkpoint, one model;
#     with BatchNormalization in training too (statistics of the whole batch);
#   - a worker killed (SIGKILL) or frozen (SIGSTOP) during calibration, and a rank that never
#     joins: the run fails with a message naming that rank, and no output file is written;
#   - ranks given different jobs, a MASTER_PORT held by another program (noise or silence) and a
#     MASTER_ADDR that does not resolve: one line saying so, and no output.
# Usage: check_distributed.sh SPARSEBIT_BINARY SOURCE_DIR
set -euo pipefail
bin="$(realpath "$1")"
src="$(realpath "$2")"
model="$src/examples/fashion_mnist/fashion_mnist_cnn.onnx"
data=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
work="$(mktemp -d)"
trap 'pkill -KILL -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# One thread per process in both runs: the float arithmetic of a batch is then the same.
run() { "$bin" -q --threads 1 "$@"; }

for observer in minmax percentile kl_histogram; do
  for mode in streaming layerwise; do
    cat >"$observer.toml" <<EOF
backend = "onnxruntime"
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-affine"
observer = "$observer"
[calibration]
mode = "$mode"
[latency]
search = false  # a timing choice: the two runs would not be byte-identical
EOF
    run quantize "$model" -c "$observer.toml" --calib "$data" --batch-size 32 --calib-count 320 -o one.onnx 2>/dev/null
    for n in 2 3; do
      run quantize "$model" -c "$observer.toml" --calib "$data" --batch-size 32 --calib-count 320 -o "n$n.onnx" \
        --nproc "$n" 2>/dev/null
      cmp -s one.onnx "n$n.onnx" || fail "$observer, $mode: --nproc $n differs from one process"
    done
    echo "ok: $observer $mode calibration, --nproc 2 and 3 byte-identical to one process"
  done
done

# Workers started by hand, as torchrun or a cluster scheduler starts them.
port=$((20000 + RANDOM % 20000))
for rank in 0 1; do
  RANK=$rank LOCAL_RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$bin" -q --threads 1 quantize "$model" -c percentile.toml --calib "$data" --batch-size 32 --calib-count 320 \
    -o env.onnx 2>"env$rank.log" &
done
wait
[[ -f env.onnx ]] || fail "workers from the environment wrote nothing: $(cat env0.log env1.log)"
run quantize "$model" -c percentile.toml --calib "$data" --batch-size 32 --calib-count 320 -o one.onnx 2>/dev/null
cmp -s one.onnx env.onnx || fail "workers from the environment differ from one process"
echo "ok: workers from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT byte-identical to one process"

# GPTQ (8-bit, so numpy reads the weights): Hessians merged, not bit-identical; same quality.
cat >gptq.toml <<'EOF'
[w]
qscheme = "per-channel-symmetric"
quantizer = "gptq"
[calibration]
mode = "asym"
EOF
run quantize "$model" -c gptq.toml --calib "$data" --batch-size 32 --calib-count 256 -o g1.onnx --report g1.json 2>/dev/null
run quantize "$model" -c gptq.toml --calib "$data" --batch-size 32 --calib-count 256 -o g2.onnx --report g2.json \
  --nproc 2 2>/dev/null
/usr/bin/python3 - g1.json g2.json <<'EOF'
import json, sys
one, two = (json.load(open(p))["calibration"]["reconstructions"] for p in sys.argv[1:])
assert [r["node"] for r in one] == [r["node"] for r in two] and one, (one, two)
for a, b in zip(one, two):
    rel = abs(a["mse_learnt"] - b["mse_learnt"]) / a["mse_learnt"]
    print(f"  gptq {a['node']}: output MSE {a['mse_learnt']:.4g} (1 process), {b['mse_learnt']:.4g} (2), {rel:.2%} apart")
    assert rel < 0.02, a["node"]
    assert b["mse_learnt"] < b["mse_nearest"], a["node"]
EOF
echo "ok: gptq over 2 processes, layer errors within 2% of one process's"

# QAT: 8-bit STE; the epoch losses agree, rank 0 alone writes the model, report and checkpoint.
# The gradients of two half batches are added in another order than one batch's, so a weight
# near a rounding edge can tip in one run and not in the other: on one 2-core VM that moved the
# second epoch's loss by 2.3e-3 (the first by 1.8e-8). The bound, 1e-2, still catches a gradient
# 10% off (a learning rate 10% higher moves the second epoch's loss by 5%).
cat >qat.toml <<'EOF'
backend = "virtual"
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-affine"
[calibration]
count = 128
batch_size = 32
[qat]
epochs = 2
batch_size = 64
count = 512
lr = 1e-4
EOF
run qat "$model" -c qat.toml --calib "$data" --train "$data" -o q1.onnx --report q1.json 2>/dev/null
run qat "$model" -c qat.toml --calib "$data" --train "$data" -o q2.onnx --report q2.json --nproc 2 2>/dev/null
[[ -f q2.onnx.ckpt ]] || fail "no checkpoint from the 2-process QAT run"
/usr/bin/python3 - q1.json q2.json <<'EOF'
import json, sys
one, two = (json.load(open(p))["qat"]["epochs"] for p in sys.argv[1:])
assert len(one) == len(two) == 2
for a, b in zip(one, two):
    rel = abs(a["loss"] - b["loss"]) / a["loss"]
    print(f"  qat epoch {a['epoch']}: loss {a['loss']:.7g} (1 process), {b['loss']:.7g} (2), {rel:.1e} apart")
    assert a["samples"] == b["samples"] == 512
    assert rel < 1e-2, (a, b)
EOF
# Resumed by both workers from rank 0's checkpoint: one more epoch.
run qat "$model" -c qat.toml --calib "$data" --train "$data" -o q2.onnx --report q3.json --nproc 2 --epochs 3 \
  2>/dev/null
/usr/bin/python3 -c "
import json; r = json.load(open('q3.json'))['qat']
assert r['resumed_after_epoch'] == 2 and [e['epoch'] for e in r['epochs']] == [3], r"
echo "ok: qat over 2 processes, epoch losses as one process's; checkpoint resumed by both"

# QAT of a model whose BatchNormalizations stay (each after a Relu, nothing to fold into):
# every step normalizes with the whole batch's statistics, summed over the processes, so the
# losses are one process's up to summation order (whose 1e-7 can tip an 8-bit activation over
# a rounding edge: up to 4e-5 measured); normalizing each slice alone moves them by 1.4e-3 to
# 2.3e-3. 500 samples: the last batch of 52 is cut too.
/usr/bin/python3 - bn.onnx <<'EOF'
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(5)
def init(name, *shape, scale=0.3, offset=0.0):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale + offset).astype(np.float32), name)
inits = [init("w1", 8, 1, 3, 3), init("b1", 8, scale=0.1), init("w2", 8, 8, 3, 3, scale=0.2), init("b2", 8, scale=0.1),
         init("fc", 10, 8), init("fcb", 10, scale=0.1)]
for k in (1, 2):
    inits += [init(f"g{k}", 8, scale=0.1, offset=1.0), init(f"be{k}", 8, scale=0.1), init(f"m{k}", 8, scale=0.2, offset=0.5),
              numpy_helper.from_array(rng.uniform(0.5, 2.0, 8).astype(np.float32), f"v{k}")]
nodes = [
    helper.make_node("Conv", ["image", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
    helper.make_node("Relu", ["c1"], ["r1"]),
    helper.make_node("BatchNormalization", ["r1", "g1", "be1", "m1", "v1"], ["n1"]),
    helper.make_node("Conv", ["n1", "w2", "b2"], ["c2"], strides=[2, 2]),
    helper.make_node("Relu", ["c2"], ["r2"]),
    helper.make_node("BatchNormalization", ["r2", "g2", "be2", "m2", "v2"], ["n2"]),
    helper.make_node("GlobalAveragePool", ["n2"], ["p"]),
    helper.make_node("Flatten", ["p"], ["f"]),
    helper.make_node("Gemm", ["f", "fc", "fcb"], ["logits"], transB=1),
]
graph = helper.make_graph(nodes, "bn_after_relu",
                          [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 28, 28])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
onnx.checker.check_model(model)
onnx.save(model, sys.argv[1])
EOF
sed -e 's/^count = 512$/count = 500/' -e 's/^lr = 1e-4$/lr = 1e-3/' qat.toml >bn.toml
run qat bn.onnx -c bn.toml --calib "$data" --train "$data" -o b1.onnx --report b1.json 2>/dev/null
run qat bn.onnx -c bn.toml --calib "$data" --train "$data" -o b2.onnx --report b2.json --nproc 2 2>/dev/null
/usr/bin/python3 - b1.json b2.json <<'EOF'
import json, sys
one, two = (json.load(open(p))["qat"]["epochs"] for p in sys.argv[1:])
assert len(one) == len(two) == 2
for a, b in zip(one, two):
    rel = abs(a["loss"] - b["loss"]) / a["loss"]
    print(f"  qat with BatchNormalization, epoch {a['epoch']}: loss {a['loss']:.7g} (1 process), {b['loss']:.7g} (2), "
          f"{rel:.1e} apart")
    assert a["samples"] == b["samples"] == 500
    assert rel < 4e-4, (a, b)
EOF
echo "ok: qat with BatchNormalization over 2 processes, batch statistics of the whole batch"

# Failures. Calibration over 40000 samples takes several seconds: long enough to hit a worker.
cat >slow.toml <<'EOF'
backend = "onnxruntime"
[w]
qscheme = "per-channel-symmetric"
[a]
qscheme = "per-tensor-affine"
EOF
hit_worker() {  # SIGNAL: sends it to rank 1 once rank 0 is calibrating; prints the run's status
  local signal="$1"
  SPARSEBIT_DIST_TIMEOUT=5 "$bin" --threads 1 quantize "$model" -c slow.toml --calib "$data" --batch-size 8 \
    --calib-count 40000 -o dead.onnx --nproc 2 2>"$signal.log" &
  local parent=$!
  for _ in $(seq 300); do
    grep -q "calibrating on" "$signal.log" 2>/dev/null && break
    sleep 0.05
  done
  local worker=""
  for pid in $(pgrep -P "$parent"); do
    tr '\0' '\n' <"/proc/$pid/environ" | grep -qx RANK=1 && worker=$pid
  done
  [[ -n $worker ]] || fail "no worker of rank 1 under $parent"
  kill "-$signal" "$worker"
  local status=0
  wait "$parent" || status=$?
  kill -KILL "$worker" 2>/dev/null || true
  echo "$status"
}
status=$(hit_worker KILL)
[[ $status -ne 0 ]] || fail "a killed worker did not fail the run"
grep -q "worker rank 1 .* was killed by signal 9" KILL.log || fail "the message does not name rank 1: $(cat KILL.log)"
[[ ! -e dead.onnx ]] || fail "a run with a killed worker wrote its output"
echo "ok: a killed worker ends the run: $(grep 'worker rank 1' KILL.log)"

start=$(date +%s)
status=$(hit_worker STOP)
[[ $status -ne 0 ]] || fail "a frozen worker did not fail the run"
grep -q "rank 1 stopped responding" STOP.log || fail "the message does not name the frozen rank 1: $(cat STOP.log)"
[[ ! -e dead.onnx ]] || fail "a run with a frozen worker wrote its output"
echo "ok: a frozen worker ends the run in $(($(date +%s) - start)) s: $(grep -o 'rank 1 stopped responding.*' STOP.log | head -1)"

# The command killed (SIGKILL, which it cannot catch) mid-calibration: its workers die with it
# and no output appears afterwards.
"$bin" --threads 1 quantize "$model" -c slow.toml --calib "$data" --batch-size 8 --calib-count 40000 \
  -o orphan.onnx --nproc 2 2>orphan.log &
parent=$!
for _ in $(seq 300); do
  grep -q "calibrating on" orphan.log 2>/dev/null && break
  sleep 0.05
done
workers=$(pgrep -P "$parent" | tr '\n' ' ')
[[ -n $workers ]] || fail "no workers under $parent"
kill -KILL "$parent"
wait "$parent" 2>/dev/null || true
for _ in $(seq 100); do
  alive=0
  for w in $workers; do kill -0 "$w" 2>/dev/null && alive=1; done
  [[ $alive == 0 ]] && break
  sleep 0.1
done
[[ $alive == 0 ]] || fail "workers $workers outlived their killed parent"
sleep 1
[[ ! -e orphan.onnx ]] || fail "the workers of a killed command wrote its output"
echo "ok: the workers of a killed command die with it: $(grep -c 'interrupted by SIGTERM' orphan.log) line(s) 'interrupted by SIGTERM'"

# More workers than cores is refused before any start.
status=0
"$bin" quantize "$model" -c slow.toml --calib "$data" -o many.onnx --nproc 100000 2>many.log || status=$?
[[ $status -ne 0 ]] && grep -q "more workers than this machine's" many.log || fail "--nproc 100000 was not refused: $(cat many.log)"
echo "ok: $(grep -o -- '--nproc 100000 is more.*' many.log)"

# A rank that never joins: rank 0 alone, the rendezvous times out naming rank 1.
status=0
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 1)) SPARSEBIT_DIST_TIMEOUT=3 \
  "$bin" --threads 1 quantize "$model" -c slow.toml --calib "$data" -o alone.onnx 2>alone.log || status=$?
[[ $status -ne 0 ]] || fail "rank 0 without rank 1 did not fail"
grep -q "rank(s) 1 of 2 did not join within 3 s" alone.log || fail "no rendezvous message naming rank 1: $(cat alone.log)"
[[ ! -e alone.onnx ]] || fail "rank 0 alone wrote its output"
echo "ok: a rank that never joins is named: $(grep -o 'rank(s) 1 of 2 did not join.*' alone.log)"
# Ranks given different jobs are refused at the rendezvous, naming what differs, and write nothing.
for rank in 0 1; do
  RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 2)) SPARSEBIT_DIST_TIMEOUT=20 \
    "$bin" -q --threads 1 quantize "$model" -c slow.toml --calib "$data" --calib-count $((64 + 256 * rank)) \
    -o differ.onnx 2>"differ$rank.log" &
done
wait || true
for rank in 0 1; do
  grep -q "rank 1's calibration count is 320, rank 0's 64" "differ$rank.log" ||
    fail "rank $rank did not name the differing --calib-count: $(cat "differ$rank.log")"
done
[[ ! -e differ.onnx ]] || fail "ranks with different jobs wrote an output"
echo "ok: $(grep -o 'the ranks were not given the same job ([^)]*)' differ0.log)"

# A MASTER_PORT held by another program: one that answers with random bytes, one that accepts
# and never answers; and a MASTER_ADDR that does not resolve. One clear line each, no crash.
/usr/bin/python3 - $((port + 3)) $((port + 4)) <<'EOF' &
import os, socket, sys, threading, time
def serve(port, answer):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(16)
    while True:
        c, _ = s.accept()
        threading.Thread(target=answer, args=(c,), daemon=True).start()
def noise(c):
    try:
        c.sendall(os.urandom(1 << 16))
        time.sleep(30)
    except OSError:
        pass
def silence(c):
    time.sleep(3600)
threading.Thread(target=serve, args=(int(sys.argv[1]), noise), daemon=True).start()
serve(int(sys.argv[2]), silence)
EOF
impostor=$!
sleep 1
for case in noise silence unresolvable; do
  addr=127.0.0.1
  case $case in
    noise) p=$((port + 3)) ;;
    silence) p=$((port + 4)) ;;
    unresolvable) p=$((port + 5)) addr=no-such-host.invalid ;;
  esac
  status=0
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=$addr MASTER_PORT=$p SPARSEBIT_DIST_TIMEOUT=2 timeout 60 \
    "$bin" --threads 1 quantize "$model" -c slow.toml --calib "$data" -o impostor.onnx 2>"$case.log" || status=$?
  [[ $status == 1 && $(wc -l <"$case.log") == 1 ]] || fail "$case: status $status, $(cat "$case.log")"
  [[ ! -e impostor.onnx ]] || fail "$case: an output was written"
  echo "ok: $case: $(cat "$case.log")"
done
grep -q "answered with bytes that are not a rendezvous store's\|the rendezvous with the store at .* failed" noise.log ||
  fail "random bytes on MASTER_PORT not named: $(cat noise.log)"
grep -q "accepted the connection but has not answered in 17 s" silence.log ||
  fail "a silent MASTER_PORT not named: $(cat silence.log)"
grep -q "MASTER_ADDR='no-such-host.invalid' does not resolve" unresolvable.log ||
  fail "an unresolvable MASTER_ADDR not named: $(cat unresolvable.log)"
kill "$impostor"
echo "check passed"
