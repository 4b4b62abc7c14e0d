#!/usr/bin/env bash
# Two "hosts" for one DDP run: two network namespaces joined by a veth pair, one rank in each,
# rendezvous and Gloo traffic over the link (not loopback), the way two machines would run it.
#
#   tests/dist/two_hosts.sh KILN_BINARY SOURCE_DIR
#
# Needs root or CAP_SYS_ADMIN + CAP_NET_ADMIN (ip netns add); otherwise it exits 77 (skipped)
# with the reason. Names carry the shell's pid, so parallel runs do not collide; the addresses
# may repeat since each pair lives in its own namespaces. Everything created is removed on exit.
set -u

kiln=${1:?usage: two_hosts.sh KILN_BINARY SOURCE_DIR}
src=${2:?usage: two_hosts.sh KILN_BINARY SOURCE_DIR}
steps=5
port=29500            # fresh namespaces: nothing else listens there
rank_timeout=240      # seconds per rank, a hang backstop below ctest's
addr_a=10.231.0.1 addr_b=10.231.0.2

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}

command -v ip >/dev/null 2>&1 || skip "the 'ip' command (iproute2) is not installed"
[[ -x $kiln ]] || fail "no kiln binary at $kiln"
[[ -f $src/configs/quickstart.toml ]] || fail "no configs/quickstart.toml under $src"

ns_a=kiln-a-$$ ns_b=kiln-b-$$
veth_a=kva$$ veth_b=kvb$$  # interface names: at most 15 characters
work=$(mktemp -d "${TMPDIR:-/tmp}/kiln-two-hosts.XXXXXX")
pids=()

cleanup() {
  # Each pid is timeout(1), which relays TERM to kiln; a second TERM makes kiln exit at once.
  local live=()
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && live+=("$pid"); done
  if ((${#live[@]})); then
    kill -TERM "${live[@]}" 2>/dev/null
    sleep 1
    kill -TERM "${live[@]}" 2>/dev/null
    sleep 1
    kill -KILL "${live[@]}" 2>/dev/null
    wait "${live[@]}" 2>/dev/null
  fi
  # Deleting a namespace deletes the veth end inside it, and with it its peer.
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  ip link del "$veth_a" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! err=$(ip netns add "$ns_a" 2>&1); then
  skip "cannot create a network namespace (needs root or CAP_SYS_ADMIN): $err"
fi
ip netns add "$ns_b" || fail "ip netns add $ns_b failed after $ns_a worked"
if ! err=$(ip link add "$veth_a" type veth peer name "$veth_b" 2>&1); then
  skip "cannot create a veth pair (no veth support in this kernel?): $err"
fi
if ! ip link set "$veth_a" netns "$ns_a" || ! ip link set "$veth_b" netns "$ns_b"; then
  fail "cannot move the veth ends into the namespaces"
fi
for side in "a $ns_a $veth_a $addr_a" "b $ns_b $veth_b $addr_b"; do
  read -r _ ns dev addr <<<"$side"
  if ! { ip -n "$ns" link set lo up && ip -n "$ns" addr add "$addr/24" dev "$dev" &&
    ip -n "$ns" link set "$dev" up; }; then
    fail "cannot configure $dev in $ns"
  fi
done

# The link must carry traffic before kiln is asked to use it (the veth may take a moment to
# report carrier). Without ping, a TCP connect to a closed port that is refused proves the
# address answers just as well.
reachable() {
  if command -v ping >/dev/null 2>&1; then
    ip netns exec "$ns_b" ping -c 1 -W 1 "$addr_a" >/dev/null 2>&1
  else
    local out
    out=$(LC_ALL=C ip netns exec "$ns_b" timeout 2 bash -c "exec 3<>/dev/tcp/$addr_a/$port" 2>&1)
    [[ $? == 0 || $out == *"Connection refused"* ]]
  fi
}
for _ in $(seq 50); do
  reachable && break
  sleep 0.1
done
reachable || fail "$ns_b cannot reach $addr_a over the veth pair"

# The quickstart pipeline, shortened and on the CPU (Gloo). Fashion-MNIST when it is installed,
# else the same shapes from the synthetic dataset.
data=(data.workers=0)
if [[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  data+=(data.dataset=fashion-mnist data.root=/usr/share/datasets/fashion-mnist)
else
  data+=(data.dataset=synthetic)
fi
sets=()
for kv in run.device=cpu run.max_steps=$steps run.epochs=1 run.eval=false run.checkpoints=false \
  run.tensorboard=false run.threads=1 run.log_interval=1 "${data[@]}" dist.backend=gloo \
  dist.timeout_s=60; do
  sets+=(--set "$kv")
done
metrics=$work/metrics.jsonl

start_rank() {  # rank namespace device
  local rank=$1 ns=$2 dev=$3
  mkdir -p "$work/rank$rank"
  # Both ranks get the same --metrics path, as `kiln launch` gives them: rank 0 alone writes it.
  ip netns exec "$ns" env RANK="$rank" WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
    MASTER_ADDR="$addr_a" MASTER_PORT="$port" GLOO_SOCKET_IFNAME="$dev" OMP_NUM_THREADS=1 \
    timeout -s KILL "$rank_timeout" "$kiln" run "$src/configs/quickstart.toml" \
    "${sets[@]}" --set "run.output_dir=$work/rank$rank/out" \
    --metrics "$metrics" >"$work/rank$rank.log" 2>&1 &
  pids+=($!)
}
start_rank 0 "$ns_a" "$veth_a"
start_rank 1 "$ns_b" "$veth_b"

# Wait for both; once one fails, stop the other (it would wait for its peer until the timeout).
codes=(running running)
while [[ ${codes[0]} == running || ${codes[1]} == running ]]; do
  for r in 0 1; do
    if [[ ${codes[r]} == running ]] && ! kill -0 "${pids[r]}" 2>/dev/null; then
      wait "${pids[r]}"
      codes[r]=$?
      if ((codes[r] != 0)); then
        other=$((1 - r))
        [[ ${codes[other]} == running ]] && kill -TERM "${pids[other]}" 2>/dev/null
      fi
    fi
  done
  sleep 0.2
done

show_logs() {
  for r in 0 1; do
    echo "--- rank $r (exit ${codes[r]}):"
    tail -n 30 "$work/rank$r.log"
  done
}
if ((codes[0] != 0 || codes[1] != 0)); then
  show_logs
  fail "rank 0 exited ${codes[0]}, rank 1 exited ${codes[1]}"
fi

[[ -f $metrics ]] || {
  show_logs
  fail "rank 0 wrote no metrics file"
}
step_lines=$(grep -c '"type": *"step"' "$metrics")
if ((step_lines != steps)); then
  show_logs
  cat "$metrics"
  fail "the metrics file has $step_lines step records, expected $steps (rank 0 alone writes it)"
fi

# The gradients really crossed the link: 5 all-reduces of the model's gradients plus the initial
# broadcast, each rank sending about one model's worth per all-reduce.
tx_a=$(ip netns exec "$ns_a" cat "/sys/class/net/$veth_a/statistics/tx_bytes")
tx_b=$(ip netns exec "$ns_b" cat "/sys/class/net/$veth_b/statistics/tx_bytes")
min_bytes=500000
if ((tx_a < min_bytes || tx_b < min_bytes)); then
  show_logs
  fail "only $tx_a / $tx_b bytes crossed the veth pair (expected >= $min_bytes each way)"
fi

echo "PASS: 2 ranks in 2 network namespaces over $veth_a/$veth_b: $steps steps," \
  "$tx_a bytes sent by rank 0 and $tx_b by rank 1"
