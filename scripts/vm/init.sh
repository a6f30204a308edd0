#!/bin/busybox sh
# Stage 1, PID 1 of the guest (runs from the initramfs): loads the virtio/9p/overlay modules, builds the root
# (the host's / over 9p, read-only, under a tmpfs overlay so nothing reaches the host), mounts cgroup2 alone
# with every controller enabled for the subtree, then switch_root's into stage 2 (the job).
# With husk.node=1 on the kernel command line (scripts/vm-test --node) it writes the node guest's systemd
# configuration into the overlay instead and switch_root's into systemd, which mounts cgroup2 itself and
# starts stage 2 as a service (node/husk-vm-job.service).
/bin/busybox mkdir -p /usr/bin /sbin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

fail() {
    echo "husk-vm: init: $*"
    # Without an exit-code file the host reports a failure; power off now rather than wait for its timeout.
    poweroff -f
    sleep 5
    exit 1
}

mount -t proc proc /proc || fail "mount /proc"
mount -t sysfs sysfs /sys || fail "mount /sys"
mount -t devtmpfs devtmpfs /dev || fail "mount /dev"
echo 1 > /proc/sys/kernel/printk
node=0
case " $(cat /proc/cmdline) " in *" husk.node=1 "*) node=1 ;; esac

while read -r m; do
    insmod "/lib/modules/$m.ko" || fail "insmod $m"
done < /lib/modules/load-order

mkdir -p /mnt/host /mnt/rw /mnt/job
# cache=loose: the host tree does not change during a run, and Python's imports stat thousands of files.
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /mnt/host \
    || fail "mount the host root over 9p"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 husk-job /mnt/job || fail "mount the job share"
mount -t tmpfs -o mode=0755 tmpfs /mnt/rw || fail "mount tmpfs"
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/host,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay /newroot \
    || fail "mount the overlay root"

for d in run tmp var/lib/husk; do
    mkdir -p "/newroot/$d"
    mount -t tmpfs -o mode=0755 tmpfs "/newroot/$d" || fail "mount tmpfs on /$d"
done
chmod 1777 /newroot/tmp
# Host paths the job needs that those tmpfs mounts would hide (a repo cloned under /tmp, say): bind them back
# from the host's tree, read-only like the rest of it.
if [ -f /mnt/job/binds ]; then
    while read -r p; do
        [ -n "$p" ] || continue
        mkdir -p "/newroot$p" && mount --bind "/mnt/host$p" "/newroot$p" || fail "bind $p from the host"
    done < /mnt/job/binds
fi
mkdir -p /newroot/run/husk-vm/job
mount --move /mnt/job /newroot/run/husk-vm/job || fail "move the job share"
cp /bin/busybox /init.stage2 /newroot/run/husk-vm/ || fail "copy stage 2"

mount -t proc proc /newroot/proc || fail "mount proc"
mount -t sysfs sysfs /newroot/sys || fail "mount sysfs"
mount -t devtmpfs devtmpfs /newroot/dev || fail "mount devtmpfs"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts || fail "mount devpts"
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm || fail "mount /dev/shm"
# the links udev/systemd make on a real system: crun reads `update --resources -` from /dev/stdin
ln -sfn /proc/self/fd /newroot/dev/fd
for n in 0:stdin 1:stdout 2:stderr; do ln -sfn "/proc/self/fd/${n%%:*}" "/newroot/dev/${n#*:}"; done

if [ "$node" = 1 ]; then
    # Everything goes into the overlay's upper tmpfs, never onto the host: a machine id of this boot, an empty
    # fstab (the host's names devices the guest lacks: systemd would wait for them), the boot target, the job
    # service and the masks (node/masked), a volatile journal.
    tr -d '-' < /proc/sys/kernel/random/uuid > /newroot/etc/machine-id || fail "write /etc/machine-id"
    : > /newroot/etc/fstab || fail "write /etc/fstab"
    # The development host is a container: systemd would take its /.dockerenv for its own and then ignore the
    # kernel command line (systemd.unit=...). Hidden by a whiteout in the overlay.
    rm -f /newroot/.dockerenv /newroot/run/.containerenv || fail "hide the host's container marker"
    units=/newroot/etc/systemd/system
    generators=/newroot/etc/systemd/system-generators
    mkdir -p "$units" "$generators" /newroot/etc/systemd/journald.conf.d || fail "mkdir $units"
    cp /node/husk-node.target /node/husk-vm-job.service "$units/" || fail "copy the node units"
    cp /node/journald.conf /newroot/etc/systemd/journald.conf.d/husk-node.conf || fail "copy journald.conf"
    while read -r unit; do
        case "$unit" in
            ''|'#'*) continue ;;
            *-generator) ln -sfn /dev/null "$generators/$unit" || fail "mask $unit" ;;
            *) ln -sfn /dev/null "$units/$unit" || fail "mask $unit" ;;
        esac
    done < /node/masked
    umount /proc /sys /dev 2>/dev/null
    exec switch_root /newroot /lib/systemd/systemd
    fail "switch_root to systemd"
fi

# cgroup v2 only: nothing mounts a v1 hierarchy. Every controller the kernel has is enabled for the subtree,
# so the tests' cgroups (and husk's) can use all of them.
mount -t cgroup2 -o nsdelegate cgroup2 /newroot/sys/fs/cgroup || fail "mount cgroup2"
controllers=$(cat /newroot/sys/fs/cgroup/cgroup.controllers)
for c in $controllers; do
    echo "+$c" > /newroot/sys/fs/cgroup/cgroup.subtree_control || fail "enable the $c controller"
done
echo "husk-vm: cgroup2 controllers: $controllers"

umount /proc /sys /dev 2>/dev/null
exec switch_root /newroot /run/husk-vm/busybox sh /run/husk-vm/init.stage2
fail "switch_root"
