# Shared by the hack/cluster scripts (sourced, not run). One cluster per
# machine: the addresses, bridges, ports and cgroup names below are fixed,
# and up/down hold $lock_file while they change the host.

cluster_dir=${HOOKLANE_CLUSTER_DIR:-/tmp/hooklane-cluster}
cluster_dir=${cluster_dir%/}
# down runs rm -rf on it.
[[ $cluster_dir == /?* ]] || { echo "HOOKLANE_CLUSTER_DIR must be an absolute path below /" >&2; exit 1; }
run_dir=$cluster_dir/run
logs_dir=$cluster_dir/logs
kubeconfig=$cluster_dir/kubeconfig
containerd_sock=$cluster_dir/containerd/containerd.sock
lock_file=/run/lock/hooklane-cluster.lock

node_name=hooklane-node
# The node's address lives on an otherwise empty bridge: some kernels (this
# project's CI VMs among them) have no `dummy` link driver.
node_bridge=hl-node
node_ip=10.98.0.1
pod_bridge=hl-pods
pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/24
cni_network=hooklane
apiserver_port=16443
etcd_client_port=12379
etcd_peer_port=12380
# 10.98.0.1: apiserver, kubelet. 127.0.0.1: etcd, then the health and
# metrics ports of kubelet, kube-proxy (2), kube-controller-manager, kube-scheduler.
node_ports=("$apiserver_port" 10250)
local_ports=("$etcd_client_port" "$etcd_peer_port" 10248 10249 10256 10257 10259)
# Our own filter chain in FORWARD, so pods can only talk among themselves
# and to the host, never route off it.
forward_chain=HOOKLANE-CLUSTER

# The sandbox image is imported from the tarball `build` writes; nothing is
# ever pulled, so the tag must never be :latest.
pause_image=localhost/hooklane/pause:1

# Host sysctls that get rewritten while the cluster runs: kubelet sets the
# kernel.* and vm.* ones at start (protectKernelDefaults=false), the CNI
# bridge plugin turns on ip_forward, and up turns on bridge netfilter so
# Service traffic between two pods on the bridge goes through kube-proxy's
# rules. up saves them, down puts them back.
host_sysctls=(kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  vm.overcommit_memory vm.panic_on_oom net.ipv4.ip_forward
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables)

# Start order; down stops them in reverse.
components=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

log() { echo "${0##*/}: $*" >&2; }
die() { log "$*"; exit 1; }

# pid_of COMPONENT prints the PID of a running component. Every component's
# command line names a file under $cluster_dir, which guards against a
# recycled PID.
pid_of() {
  local pid cmdline
  pid=$(cat "$run_dir/$1.pid" 2>/dev/null) || return 1
  # No pipe into grep -q: under pipefail, tr killed by SIGPIPE once grep
  # has its match would make a running component look gone.
  cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  [[ $cmdline == *"$cluster_dir/"* ]] || return 1
  echo "$pid"
}

# cluster_healthy: every component runs, the apiserver is ready and the node
# is Ready. $cluster_dir/env is written last by up, so it marks a finished up.
cluster_healthy() {
  [[ -f $cluster_dir/env ]] || return 1
  local c bin
  for c in "${components[@]}"; do pid_of "$c" >/dev/null || return 1; done
  bin=$(sed -n 's/^HOOKLANE_CLUSTER_BIN=//p' "$cluster_dir/env")
  "$bin/kubectl" --kubeconfig="$kubeconfig" --request-timeout=5s get --raw /readyz >/dev/null 2>&1 || return 1
  [[ $("$bin/kubectl" --kubeconfig="$kubeconfig" --request-timeout=5s get node "$node_name" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
