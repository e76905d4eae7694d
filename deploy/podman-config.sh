# Sourced by deploy/container-test.sh and deploy/k8s-play-test.sh (not run on its own).
#
# write_podman_config DIR: writes DIR/containers.conf and exports CONTAINERS_CONF to it, so podman
# uses a configuration of the calling script's own and the host's is untouched: runc as the
# runtime (crun fails on hosts with hybrid cgroups) and ulimits this host allows. A container may
# not get more than the host's hard limits (raising them needs CAP_SYS_RESOURCE), and podman 4.3
# caps its own RLIMIT_NPROC at kernel.pid_max, so the container's nproc stays at or under both.
write_podman_config() {
  local dir=$1 nofile nproc pid_max
  nofile=$(ulimit -Hn)
  nproc=$(ulimit -Hu)
  pid_max=$(cat /proc/sys/kernel/pid_max)
  [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max
  [ "$nofile" = unlimited ] && nofile=1048576
  cat >"$dir/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
CONF
  export CONTAINERS_CONF=$dir/containers.conf
}
