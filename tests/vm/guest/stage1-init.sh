#!/bin/sh
# Stage 1 (busybox initramfs): load the in-tree modules that reach the root
# disk, mount it, copy this boot's payload to /ndi on it, switch to it.
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo "MARK stage1 kernel=$(uname -r)"
while read -r m; do
    [ -n "$m" ] && insmod "/modules/$m" 2>/dev/null
done < /boot-modules.txt
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
mkdir -p /newroot
if ! mount -t ext4 -o rw /dev/vda /newroot; then
    echo "MARK stage1-error cannot mount /dev/vda"
    echo o > /proc/sysrq-trigger
    while :; do sleep 60; done  # never exit as PID 1 (init.sh says why)
fi
rm -rf /newroot/ndi
mkdir -p /newroot/ndi
cp -a /payload/. /newroot/ndi/
if [ -d /payload/rootfs-overlay ]; then
    cp -a /payload/rootfs-overlay/. /newroot/
fi
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /ndi/init.sh
