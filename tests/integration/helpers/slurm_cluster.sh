#!/bin/sh
# slurm_cluster.sh DIR CTLD_PORT N1_PORT N2_PORT -- COMMAND...: a private
# two-node Slurm cluster on this host (Debian's slurm-wlm, two slurmd with
# -N, munge with its own key and socket), runs COMMAND with SLURM_CONF set,
# and tears everything down, on failure too. Run it inside `unshare -m` after
# binding a hosts file that names n1 and n2 (the caller does): the first host
# of the job's node list must resolve on every node, as on a real cluster.
set -eu
D=$1 CTLD=$2 P1=$3 P2=$4
shift 5
host=$(hostname)
mkdir -p "$D/state" "$D/spool/n1" "$D/spool/n2" "$D/log"
# munged wants every directory above its socket searchable by all, which a
# test's private temporary directory is not: the socket gets its own.
M=$(mktemp -d /tmp/crun-munge-XXXXXXXX)
chmod 755 "$M"
head -c 1024 /dev/urandom > "$M/munge.key"
chmod 600 "$M/munge.key"
cat > "$D/slurm.conf" <<CONF
ClusterName=crun
SlurmctldHost=$host
SlurmctldPort=$CTLD
AuthType=auth/munge
AuthInfo=socket=$M/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$P1 CPUs=1 RealMemory=1000
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$P2 CPUs=1 RealMemory=1000
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=10 State=UP
CONF
export SLURM_CONF="$D/slurm.conf"
pids=
cleanup() {
	scontrol shutdown >/dev/null 2>&1 || true
	# shellcheck disable=SC2086
	[ -n "$pids" ] && kill $pids 2>/dev/null || true
	sleep 0.5
	# shellcheck disable=SC2086
	[ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
	rm -rf "$M"
}
trap cleanup EXIT INT TERM
munged -F --key-file="$M/munge.key" --socket="$M/munge.sock" --pid-file="$M/munged.pid" \
	--log-file="$D/log/munged.log" --seed-file="$M/seed" & pids="$pids $!"
i=0
until [ -S "$M/munge.sock" ]; do
	i=$((i + 1))
	[ $i -lt 100 ] || { echo "slurm_cluster: munged did not start" >&2; exit 1; }
	sleep 0.1
done
slurmctld -D -f "$D/slurm.conf" & pids="$pids $!"
slurmd -D -f "$D/slurm.conf" -N n1 & pids="$pids $!"
slurmd -D -f "$D/slurm.conf" -N n2 & pids="$pids $!"
i=0
until [ "$(timeout 5 sinfo -h -o %t 2>/dev/null | sort -u)" = "idle" ]; do
	i=$((i + 1))
	if [ $i -ge 150 ]; then
		echo "slurm_cluster: nodes never became idle" >&2
		timeout 5 sinfo >&2 || true
		tail -5 "$D"/log/*.log >&2 || true
		exit 1
	fi
	sleep 0.2
done
"$@"
