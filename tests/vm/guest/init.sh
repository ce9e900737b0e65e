#!/bin/sh
# PID 1 on the guest root: mount the API filesystems, run the scenario, power off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root LANG=C.UTF-8 TERM=dumb
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs -o mode=0755 tmpfs /run
hostname ndi-vm
echo "MARK guest-init kernel=$(uname -r) boot_id=$(cat /proc/sys/kernel/random/boot_id)"
/usr/bin/python3 -u /ndi/runner.py /ndi/scenario.json
echo "MARK runner-exit rc=$?"
sync
mount -o remount,ro / 2>/dev/null || sync
echo "MARK poweroff"
echo o > /proc/sysrq-trigger
# PID 1 must outlive the power-off (sysrq 'o' only queues it): were it to exit first, the
# kernel panics "Attempted to kill init!", which a loaded host's slow guest can reach
# after 30 s. The harness's boot timeout bounds this wait.
while :; do sleep 60; done
