"""Seccomp-BPF allow-list filter, built once in pure Python (no libseccomp).

The sandbox's zygote loads the bytes from `build_filter()` once, before it clones any command:
`prctl(PR_SET_NO_NEW_PRIVS, 1)` then `seccomp(SECCOMP_SET_MODE_FILTER, 0, &sock_fprog)` with
`sock_fprog{len = filter_length(prog), filter = prog}`. Building the program here keeps the
policy reviewable and testable, and the C side trivial.

The policy is an allow-list in the manner of the default profiles of the common container
runtimes: `ALLOWED` names the syscalls a Linux userland (shells, coreutils, compilers, Python,
pytest, pip) needs; a few of them are allowed only for some argument values (`_ARG_RULES`:
clone without namespace flags, socket and socketpair for unix/inet/inet6 only, ioctl without
terminal input injection, personality). Every other syscall the arch's table knows fails with
EPERM. A number the table does not know (a syscall newer than this file, or a hole in the
numbering) fails with ENOSYS, as do clone3 and Linux AIO (io_setup and the rest): ENOSYS is what
makes glibc and others fall back to the older call they can do without (clone; threads or plain
reads and writes for AIO, as on a kernel built without it), where EPERM would be taken as a real
refusal.

The program is a classic-BPF `struct sock_filter[]` (8 bytes each: u16 code, u8 jt, u8 jf,
u32 k). After the ABI check it is a binary search over the syscall number: the numbers are
cut into ranges of equal verdict, and each inner node compares with the first number of its
right half, so a syscall costs about log2(ranges) comparisons however long the list is:

    ld  [4]                        seccomp_data.arch
    jeq AUDIT_ARCH, 1, 0
    ret KILL_PROCESS               another ABI (e.g. i386 `int 0x80` on x86_64)
    ld  [0]                        seccomp_data.nr
    node:  jge FIRST_OF_RIGHT, 0, 1 / ja RIGHT / <left subtree> / <right subtree>
    leaf:  ret ALLOW | ret ERRNO(EPERM) | ret ERRNO(ENOSYS) | <argument rule ending in ret>

Conditional jumps reach only 255 instructions ahead, so a node whose left subtree is longer
jumps to its right subtree through `ja` (a 32-bit offset).
"""

from __future__ import annotations

import functools
import platform
import struct
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from tryloop.errors import HostUnsupported

__all__ = [
    "ALLOWED",
    "ARG_RULES",
    "NOTABLY_DENIED",
    "SOCKET_FAMILIES",
    "SUPPORTED_ARCHES",
    "SYSCALLS",
    "build_filter",
    "describe",
    "filter_length",
    "verdicts",
]

# What sandboxed programs may call. Names an arch lacks (e.g. `open` on aarch64) are skipped
# there. Deliberately absent, beyond the privileged calls every runtime denies (mount and the
# mount API, namespaces, modules, kexec, reboot, swap, clocks, quotas, acct, syslog, ...):
# ptrace and process_vm_* / pidfd_getfd / kcmp / process_madvise (other processes' memory),
# bpf, perf_event_open, userfaultfd, io_uring, keyctl and friends, fanotify, file handles,
# memfd_secret, the NUMA calls (mbind, *_mempolicy, migrate_pages, move_pages), sysfs, ustat,
# modify_ldt, the mount-listing calls (statmount, listmount, listns) and the LSM attributes.
ALLOWED: tuple[str, ...] = (
    # files and directories
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev", "preadv2",
    "pwritev2", "lseek", "open", "openat", "openat2", "creat", "close", "close_range",
    "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access", "faccessat",
    "faccessat2", "getdents", "getdents64", "getcwd", "chdir", "fchdir", "mkdir", "mkdirat",
    "rmdir", "rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat",
    "symlink", "symlinkat", "readlink", "readlinkat", "chmod", "fchmod", "fchmodat",
    "fchmodat2", "chown", "fchown", "lchown", "fchownat", "umask", "truncate", "ftruncate",
    "fallocate", "fadvise64", "readahead", "fsync", "fdatasync", "sync", "syncfs",
    "sync_file_range", "flock", "mknod", "mknodat", "utime", "utimes", "futimesat",
    "utimensat", "sendfile", "copy_file_range", "splice", "tee", "vmsplice",
    "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr", "flistxattr", "setxattr",
    "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr", "getxattrat",
    "setxattrat", "listxattrat", "removexattrat",
    # descriptors, polling, events
    "dup", "dup2", "dup3", "fcntl", "pipe", "pipe2", "select", "pselect6", "poll", "ppoll",
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2",
    "eventfd", "eventfd2", "signalfd", "signalfd4", "timerfd_create", "timerfd_settime",
    "timerfd_gettime", "inotify_init", "inotify_init1", "inotify_add_watch",
    "inotify_rm_watch", "memfd_create",
    # memory
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "msync", "mincore",
    "remap_file_pages", "mlock", "mlock2", "munlock", "mlockall", "munlockall", "membarrier",
    "pkey_alloc", "pkey_free", "pkey_mprotect", "map_shadow_stack", "mseal",
    # processes and threads (clone has an argument rule; clone3 gets ENOSYS)
    "fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid", "kill",
    "tkill", "tgkill", "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp",
    "getsid", "setsid", "set_tid_address", "set_robust_list", "get_robust_list", "futex",
    "futex_waitv", "futex_wake", "futex_wait", "futex_requeue", "rseq", "arch_prctl",
    "set_thread_area", "get_thread_area", "prctl", "seccomp", "pidfd_open",
    "pidfd_send_signal", "landlock_create_ruleset", "landlock_add_rule",
    "landlock_restrict_self",
    # credentials (changing them needs capabilities the agent does not have)
    "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid",
    "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid",
    "setgroups", "capget", "capset",
    # signals
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigqueueinfo", "rt_tgsigqueueinfo", "rt_sigsuspend", "sigaltstack", "pause",
    "restart_syscall",
    # time and timers (reading clocks, sleeping; setting them is denied)
    "time", "gettimeofday", "clock_gettime", "clock_getres", "clock_nanosleep", "nanosleep",
    "alarm", "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "times",
    # scheduling and limits
    "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
    "sched_setparam", "sched_getscheduler", "sched_setscheduler", "sched_getattr",
    "sched_setattr", "sched_get_priority_max", "sched_get_priority_min",
    "sched_rr_get_interval", "getpriority", "setpriority", "ioprio_get", "ioprio_set",
    "getrlimit", "setrlimit", "prlimit64", "getrusage", "getcpu", "sysinfo", "uname",
    "getrandom",
    # sockets (socket and socketpair have an argument rule)
    "connect", "accept", "accept4", "bind", "listen", "getsockname", "getpeername", "sendto",
    "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "setsockopt",
    "getsockopt",
    # System V and POSIX IPC (private to the sandbox's IPC namespace)
    "shmget", "shmat", "shmctl", "shmdt", "semget", "semop", "semctl", "semtimedop", "msgget",
    "msgsnd", "msgrcv", "msgctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive",
    "mq_notify", "mq_getsetattr",
)  # fmt: skip

# Denied calls worth naming in a doctor report (everything outside ALLOWED is denied).
NOTABLY_DENIED: tuple[str, ...] = (
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsmount",
    "mount_setattr", "unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_getfd", "kcmp", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "keyctl",
    "add_key", "request_key", "open_by_handle_at", "name_to_handle_at", "init_module",
    "finit_module", "kexec_load", "reboot", "swapon", "acct", "quotactl", "syslog",
    "settimeofday", "clock_settime", "adjtimex", "sethostname", "setdomainname", "iopl",
    "ioperm", "modify_ldt", "mbind", "set_mempolicy", "get_mempolicy", "migrate_pages",
    "move_pages", "sysfs", "memfd_secret", "fanotify_init", "statmount", "listmount",
)  # fmt: skip

# Constants from the kernel UAPI (linux/audit.h, linux/seccomp.h, linux/filter.h).
_AUDIT_ARCH_X86_64 = 0xC000003E  # EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE
_AUDIT_ARCH_AARCH64 = 0xC00000B7  # EM_AARCH64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000  # low 16 bits: the errno returned
_RET_ALLOW = 0x7FFF0000
_EPERM = 1
_ENOSYS = 38  # same value on x86_64 and aarch64

_BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = u32 at seccomp_data + k
_BPF_JA = 0x05  # BPF_JMP | BPF_JA: pc += k (32 bits)
_BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_BPF_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K (unsigned)
_BPF_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K: jump if A & k
_BPF_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
_BPF_RET_K = 0x06  # BPF_RET | BPF_K
_BPF_MAXINSNS = 4096  # the kernel refuses longer classic programs

# struct seccomp_data { int nr; u32 arch; u64 instruction_pointer; u64 args[6]; }.
# Both supported arches are little-endian, so an argument's low 32 bits sit at its own offset.
# Comparing only the low half is right for the arguments below: the kernel itself truncates
# them to 32 bits (int/unsigned int parameters, and clone uses lower_32_bits(flags)).
_OFF_NR = 0
_OFF_ARCH = 4


def _arg_lo(index: int) -> int:
    return 16 + 8 * index


_CLONE_NS_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,  # in clone()'s exit-signal byte: the kernel rejects it anyway
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
_CLONE_NS_MASK = functools.reduce(int.__or__, _CLONE_NS_FLAGS.values())
_TIOCSTI = 0x5412  # push a byte into a terminal's input queue: types commands into its owner
_TIOCLINUX = 0x541C  # virtual-console tricks, including selection paste (same injection)
# Socket families a task needs: local sockets and IP in the sandbox's own network namespace.
# Not netlink: glibc's getaddrinfo falls back when it cannot open one (it then assumes both
# IPv4 and IPv6 are configured), and the sandbox's namespace has only `lo` to ask about,
# while the netlink families are a large kernel surface (routing, xfrm, netfilter, audit).
SOCKET_FAMILIES: Mapping[str, int] = MappingProxyType({"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10})
_AF_INET = 2
_SOCK_PACKET = 10  # obsolete: socket(AF_INET, SOCK_PACKET) is silently made an AF_PACKET socket
_SOCK_TYPE_MASK = 0xF  # the type argument also carries SOCK_NONBLOCK / SOCK_CLOEXEC
# Personas Docker's default profile allows: Linux, PER_LINUX32, UNAME26, both, and the
# 0xffffffff query. Others (e.g. ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC) weaken the process.
_PERSONAS_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)


def _parse_table(text: str) -> Mapping[str, int]:
    pairs = (item.split("=") for item in text.split())
    return MappingProxyType({name: int(nr) for name, nr in pairs})


# Full tables: they decide which numbers are known (EPERM when not allowed) and which are
# not (ENOSYS), and extra_deny may name any syscall. Generated from the Linux 6.1 UAPI headers
# (x86_64: asm/unistd_64.h; aarch64: asm-generic/unistd.h with arm64's __ARCH_WANT_RENAMEAT,
# NEW_STAT, SET_GET_RLIMIT, SYS_CLONE3, MEMFD_SECRET), plus 451-470 (cachestat .. listns)
# from upstream's syscall tables, where both arches share the numbers.
_X86_64_TABLE = """
read=0 write=1 open=2 close=3 stat=4 fstat=5 lstat=6 poll=7 lseek=8 mmap=9 mprotect=10 munmap=11
brk=12 rt_sigaction=13 rt_sigprocmask=14 rt_sigreturn=15 ioctl=16 pread64=17 pwrite64=18
readv=19 writev=20 access=21 pipe=22 select=23 sched_yield=24 mremap=25 msync=26 mincore=27
madvise=28 shmget=29 shmat=30 shmctl=31 dup=32 dup2=33 pause=34 nanosleep=35 getitimer=36
alarm=37 setitimer=38 getpid=39 sendfile=40 socket=41 connect=42 accept=43 sendto=44 recvfrom=45
sendmsg=46 recvmsg=47 shutdown=48 bind=49 listen=50 getsockname=51 getpeername=52 socketpair=53
setsockopt=54 getsockopt=55 clone=56 fork=57 vfork=58 execve=59 exit=60 wait4=61 kill=62
uname=63 semget=64 semop=65 semctl=66 shmdt=67 msgget=68 msgsnd=69 msgrcv=70 msgctl=71 fcntl=72
flock=73 fsync=74 fdatasync=75 truncate=76 ftruncate=77 getdents=78 getcwd=79 chdir=80 fchdir=81
rename=82 mkdir=83 rmdir=84 creat=85 link=86 unlink=87 symlink=88 readlink=89 chmod=90 fchmod=91
chown=92 fchown=93 lchown=94 umask=95 gettimeofday=96 getrlimit=97 getrusage=98 sysinfo=99
times=100 ptrace=101 getuid=102 syslog=103 getgid=104 setuid=105 setgid=106 geteuid=107
getegid=108 setpgid=109 getppid=110 getpgrp=111 setsid=112 setreuid=113 setregid=114
getgroups=115 setgroups=116 setresuid=117 getresuid=118 setresgid=119 getresgid=120 getpgid=121
setfsuid=122 setfsgid=123 getsid=124 capget=125 capset=126 rt_sigpending=127 rt_sigtimedwait=128
rt_sigqueueinfo=129 rt_sigsuspend=130 sigaltstack=131 utime=132 mknod=133 uselib=134
personality=135 ustat=136 statfs=137 fstatfs=138 sysfs=139 getpriority=140 setpriority=141
sched_setparam=142 sched_getparam=143 sched_setscheduler=144 sched_getscheduler=145
sched_get_priority_max=146 sched_get_priority_min=147 sched_rr_get_interval=148 mlock=149
munlock=150 mlockall=151 munlockall=152 vhangup=153 modify_ldt=154 pivot_root=155 _sysctl=156
prctl=157 arch_prctl=158 adjtimex=159 setrlimit=160 chroot=161 sync=162 acct=163
settimeofday=164 mount=165 umount2=166 swapon=167 swapoff=168 reboot=169 sethostname=170
setdomainname=171 iopl=172 ioperm=173 create_module=174 init_module=175 delete_module=176
get_kernel_syms=177 query_module=178 quotactl=179 nfsservctl=180 getpmsg=181 putpmsg=182
afs_syscall=183 tuxcall=184 security=185 gettid=186 readahead=187 setxattr=188 lsetxattr=189
fsetxattr=190 getxattr=191 lgetxattr=192 fgetxattr=193 listxattr=194 llistxattr=195
flistxattr=196 removexattr=197 lremovexattr=198 fremovexattr=199 tkill=200 time=201 futex=202
sched_setaffinity=203 sched_getaffinity=204 set_thread_area=205 io_setup=206 io_destroy=207
io_getevents=208 io_submit=209 io_cancel=210 get_thread_area=211 lookup_dcookie=212
epoll_create=213 epoll_ctl_old=214 epoll_wait_old=215 remap_file_pages=216 getdents64=217
set_tid_address=218 restart_syscall=219 semtimedop=220 fadvise64=221 timer_create=222
timer_settime=223 timer_gettime=224 timer_getoverrun=225 timer_delete=226 clock_settime=227
clock_gettime=228 clock_getres=229 clock_nanosleep=230 exit_group=231 epoll_wait=232
epoll_ctl=233 tgkill=234 utimes=235 vserver=236 mbind=237 set_mempolicy=238 get_mempolicy=239
mq_open=240 mq_unlink=241 mq_timedsend=242 mq_timedreceive=243 mq_notify=244 mq_getsetattr=245
kexec_load=246 waitid=247 add_key=248 request_key=249 keyctl=250 ioprio_set=251 ioprio_get=252
inotify_init=253 inotify_add_watch=254 inotify_rm_watch=255 migrate_pages=256 openat=257
mkdirat=258 mknodat=259 fchownat=260 futimesat=261 newfstatat=262 unlinkat=263 renameat=264
linkat=265 symlinkat=266 readlinkat=267 fchmodat=268 faccessat=269 pselect6=270 ppoll=271
unshare=272 set_robust_list=273 get_robust_list=274 splice=275 tee=276 sync_file_range=277
vmsplice=278 move_pages=279 utimensat=280 epoll_pwait=281 signalfd=282 timerfd_create=283
eventfd=284 fallocate=285 timerfd_settime=286 timerfd_gettime=287 accept4=288 signalfd4=289
eventfd2=290 epoll_create1=291 dup3=292 pipe2=293 inotify_init1=294 preadv=295 pwritev=296
rt_tgsigqueueinfo=297 perf_event_open=298 recvmmsg=299 fanotify_init=300 fanotify_mark=301
prlimit64=302 name_to_handle_at=303 open_by_handle_at=304 clock_adjtime=305 syncfs=306
sendmmsg=307 setns=308 getcpu=309 process_vm_readv=310 process_vm_writev=311 kcmp=312
finit_module=313 sched_setattr=314 sched_getattr=315 renameat2=316 seccomp=317 getrandom=318
memfd_create=319 kexec_file_load=320 bpf=321 execveat=322 userfaultfd=323 membarrier=324
mlock2=325 copy_file_range=326 preadv2=327 pwritev2=328 pkey_mprotect=329 pkey_alloc=330
pkey_free=331 statx=332 io_pgetevents=333 rseq=334 pidfd_send_signal=424 io_uring_setup=425
io_uring_enter=426 io_uring_register=427 open_tree=428 move_mount=429 fsopen=430 fsconfig=431
fsmount=432 fspick=433 pidfd_open=434 clone3=435 close_range=436 openat2=437 pidfd_getfd=438
faccessat2=439 process_madvise=440 epoll_pwait2=441 mount_setattr=442 quotactl_fd=443
landlock_create_ruleset=444 landlock_add_rule=445 landlock_restrict_self=446 memfd_secret=447
process_mrelease=448 futex_waitv=449 set_mempolicy_home_node=450 cachestat=451 fchmodat2=452
map_shadow_stack=453 futex_wake=454 futex_wait=455 futex_requeue=456 statmount=457 listmount=458
lsm_get_self_attr=459 lsm_set_self_attr=460 lsm_list_modules=461 mseal=462 setxattrat=463
getxattrat=464 listxattrat=465 removexattrat=466 open_tree_attr=467 file_getattr=468
file_setattr=469 listns=470
"""

# aarch64 has no syscall table of its own: it uses the asm-generic numbering.
_AARCH64_TABLE = """
io_setup=0 io_destroy=1 io_submit=2 io_cancel=3 io_getevents=4 setxattr=5 lsetxattr=6
fsetxattr=7 getxattr=8 lgetxattr=9 fgetxattr=10 listxattr=11 llistxattr=12 flistxattr=13
removexattr=14 lremovexattr=15 fremovexattr=16 getcwd=17 lookup_dcookie=18 eventfd2=19
epoll_create1=20 epoll_ctl=21 epoll_pwait=22 dup=23 dup3=24 fcntl=25 inotify_init1=26
inotify_add_watch=27 inotify_rm_watch=28 ioctl=29 ioprio_set=30 ioprio_get=31 flock=32
mknodat=33 mkdirat=34 unlinkat=35 symlinkat=36 linkat=37 renameat=38 umount2=39 mount=40
pivot_root=41 nfsservctl=42 statfs=43 fstatfs=44 truncate=45 ftruncate=46 fallocate=47
faccessat=48 chdir=49 fchdir=50 chroot=51 fchmod=52 fchmodat=53 fchownat=54 fchown=55 openat=56
close=57 vhangup=58 pipe2=59 quotactl=60 getdents64=61 lseek=62 read=63 write=64 readv=65
writev=66 pread64=67 pwrite64=68 preadv=69 pwritev=70 sendfile=71 pselect6=72 ppoll=73
signalfd4=74 vmsplice=75 splice=76 tee=77 readlinkat=78 newfstatat=79 fstat=80 sync=81 fsync=82
fdatasync=83 sync_file_range=84 timerfd_create=85 timerfd_settime=86 timerfd_gettime=87
utimensat=88 acct=89 capget=90 capset=91 personality=92 exit=93 exit_group=94 waitid=95
set_tid_address=96 unshare=97 futex=98 set_robust_list=99 get_robust_list=100 nanosleep=101
getitimer=102 setitimer=103 kexec_load=104 init_module=105 delete_module=106 timer_create=107
timer_gettime=108 timer_getoverrun=109 timer_settime=110 timer_delete=111 clock_settime=112
clock_gettime=113 clock_getres=114 clock_nanosleep=115 syslog=116 ptrace=117 sched_setparam=118
sched_setscheduler=119 sched_getscheduler=120 sched_getparam=121 sched_setaffinity=122
sched_getaffinity=123 sched_yield=124 sched_get_priority_max=125 sched_get_priority_min=126
sched_rr_get_interval=127 restart_syscall=128 kill=129 tkill=130 tgkill=131 sigaltstack=132
rt_sigsuspend=133 rt_sigaction=134 rt_sigprocmask=135 rt_sigpending=136 rt_sigtimedwait=137
rt_sigqueueinfo=138 rt_sigreturn=139 setpriority=140 getpriority=141 reboot=142 setregid=143
setgid=144 setreuid=145 setuid=146 setresuid=147 getresuid=148 setresgid=149 getresgid=150
setfsuid=151 setfsgid=152 times=153 setpgid=154 getpgid=155 getsid=156 setsid=157 getgroups=158
setgroups=159 uname=160 sethostname=161 setdomainname=162 getrlimit=163 setrlimit=164
getrusage=165 umask=166 prctl=167 getcpu=168 gettimeofday=169 settimeofday=170 adjtimex=171
getpid=172 getppid=173 getuid=174 geteuid=175 getgid=176 getegid=177 gettid=178 sysinfo=179
mq_open=180 mq_unlink=181 mq_timedsend=182 mq_timedreceive=183 mq_notify=184 mq_getsetattr=185
msgget=186 msgctl=187 msgrcv=188 msgsnd=189 semget=190 semctl=191 semtimedop=192 semop=193
shmget=194 shmctl=195 shmat=196 shmdt=197 socket=198 socketpair=199 bind=200 listen=201
accept=202 connect=203 getsockname=204 getpeername=205 sendto=206 recvfrom=207 setsockopt=208
getsockopt=209 shutdown=210 sendmsg=211 recvmsg=212 readahead=213 brk=214 munmap=215 mremap=216
add_key=217 request_key=218 keyctl=219 clone=220 execve=221 mmap=222 fadvise64=223 swapon=224
swapoff=225 mprotect=226 msync=227 mlock=228 munlock=229 mlockall=230 munlockall=231 mincore=232
madvise=233 remap_file_pages=234 mbind=235 get_mempolicy=236 set_mempolicy=237 migrate_pages=238
move_pages=239 rt_tgsigqueueinfo=240 perf_event_open=241 accept4=242 recvmmsg=243 wait4=260
prlimit64=261 fanotify_init=262 fanotify_mark=263 name_to_handle_at=264 open_by_handle_at=265
clock_adjtime=266 syncfs=267 setns=268 sendmmsg=269 process_vm_readv=270 process_vm_writev=271
kcmp=272 finit_module=273 sched_setattr=274 sched_getattr=275 renameat2=276 seccomp=277
getrandom=278 memfd_create=279 bpf=280 execveat=281 userfaultfd=282 membarrier=283 mlock2=284
copy_file_range=285 preadv2=286 pwritev2=287 pkey_mprotect=288 pkey_alloc=289 pkey_free=290
statx=291 io_pgetevents=292 rseq=293 kexec_file_load=294 pidfd_send_signal=424
io_uring_setup=425 io_uring_enter=426 io_uring_register=427 open_tree=428 move_mount=429
fsopen=430 fsconfig=431 fsmount=432 fspick=433 pidfd_open=434 clone3=435 close_range=436
openat2=437 pidfd_getfd=438 faccessat2=439 process_madvise=440 epoll_pwait2=441
mount_setattr=442 quotactl_fd=443 landlock_create_ruleset=444 landlock_add_rule=445
landlock_restrict_self=446 memfd_secret=447 process_mrelease=448 futex_waitv=449
set_mempolicy_home_node=450 cachestat=451 fchmodat2=452 map_shadow_stack=453 futex_wake=454
futex_wait=455 futex_requeue=456 statmount=457 listmount=458 lsm_get_self_attr=459
lsm_set_self_attr=460 lsm_list_modules=461 mseal=462 setxattrat=463 getxattrat=464
listxattrat=465 removexattrat=466 open_tree_attr=467 file_getattr=468 file_setattr=469
listns=470
"""

SYSCALLS: Mapping[str, Mapping[str, int]] = MappingProxyType(
    {"x86_64": _parse_table(_X86_64_TABLE), "aarch64": _parse_table(_AARCH64_TABLE)}
)

_ARCHES: Mapping[str, int] = MappingProxyType(
    {"x86_64": _AUDIT_ARCH_X86_64, "aarch64": _AUDIT_ARCH_AARCH64}
)
SUPPORTED_ARCHES: tuple[str, ...] = tuple(_ARCHES)
_ARCH_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}
_ALL_NAMES = frozenset(name for table in SYSCALLS.values() for name in table)

# Insn = (code, jt, jf, k)
_Insn = tuple[int, int, int, int]


def _stmt(code: int, k: int) -> _Insn:
    return (code, 0, 0, k)


def _jump(code: int, k: int, jt: int, jf: int) -> _Insn:
    return (code, jt, jf, k)


def _ret(action: int) -> _Insn:
    return _stmt(_BPF_RET_K, action)


_DENY = _ret(_RET_ERRNO | _EPERM)
_NOSYS = _ret(_RET_ERRNO | _ENOSYS)
_ALLOW = _ret(_RET_ALLOW)


def _arg_in(arg: int, values: Iterable[int], on_match: _Insn, otherwise: _Insn,
            mask: int | None = None) -> tuple[_Insn, ...]:
    """Body of a rule: `on_match` if the argument's low 32 bits (masked) is one of `values`."""
    values = tuple(values)
    n = len(values)
    body = [_stmt(_BPF_LD_W_ABS, _arg_lo(arg))]
    if mask is not None:
        body.append(_stmt(_BPF_AND_K, mask))
    # JEQ number j jumps over the n - 1 - j JEQs after it and `otherwise` to reach on_match.
    body += [_jump(_BPF_JEQ_K, v, n - j, 0) for j, v in enumerate(values)]
    return (*body, otherwise, on_match)


def _clone_body() -> tuple[_Insn, ...]:
    return (
        _stmt(_BPF_LD_W_ABS, _arg_lo(0)),
        _jump(_BPF_JSET_K, _CLONE_NS_MASK, 0, 1),
        _DENY,
        _ALLOW,
    )


def _socket_body(other_family: _Insn | None = None) -> tuple[_Insn, ...]:
    """socket(): unix, inet6, and inet but not SOCK_PACKET; other families get `other_family`
    (default EPERM)."""
    unix, inet, inet6 = SOCKET_FAMILIES["AF_UNIX"], SOCKET_FAMILIES["AF_INET"], SOCKET_FAMILIES["AF_INET6"]
    tail = () if other_family is None else (other_family,)
    return (
        _stmt(_BPF_LD_W_ABS, _arg_lo(0)),  # 0: domain
        _jump(_BPF_JEQ_K, unix, 6, 0),  # 1: -> 8 allow
        _jump(_BPF_JEQ_K, inet6, 5, 0),  # 2: -> 8 allow
        _jump(_BPF_JEQ_K, inet, 0, 5 + len(tail)),  # 3: another family -> 9 deny, or 10 its own answer
        _stmt(_BPF_LD_W_ABS, _arg_lo(1)),  # 4: type
        _stmt(_BPF_AND_K, _SOCK_TYPE_MASK),  # 5
        _jump(_BPF_JEQ_K, _SOCK_PACKET, 2, 0),  # 6: -> 9 deny
        _ALLOW,  # 7
        _ALLOW,  # 8
        _DENY,  # 9
        *tail,  # 10
    )


# name -> (body of the rule, doctor-report line). Each body ends in a ret, so a rule is a leaf
# of the search tree and may clobber the accumulator.
ARG_RULES: Mapping[str, tuple[tuple[_Insn, ...], str]] = MappingProxyType(
    {
        "clone": (
            _clone_body(),
            "clone: EPERM when flags ask for a new namespace (" + "|".join(_CLONE_NS_FLAGS) + ")",
        ),
        "ioctl": (
            _arg_in(1, (_TIOCSTI, _TIOCLINUX), on_match=_DENY, otherwise=_ALLOW),
            "ioctl: EPERM for TIOCSTI and TIOCLINUX (terminal input injection)",
        ),
        "socket": (
            _socket_body(),
            "socket: only " + ", ".join(SOCKET_FAMILIES) + " (EPERM for every other family, "
            "e.g. netlink, packet, vsock, alg), and not AF_INET/SOCK_PACKET",
        ),
        "socketpair": (
            _arg_in(0, (SOCKET_FAMILIES["AF_UNIX"],), on_match=_ALLOW, otherwise=_DENY),
            "socketpair: AF_UNIX only",
        ),
        "personality": (
            _arg_in(0, _PERSONAS_ALLOWED, on_match=_ALLOW, otherwise=_DENY),
            "personality: EPERM except PER_LINUX, PER_LINUX32, UNAME26 and the query",
        ),
    }
)
# Build sandboxes (image builds): a socket family outside unix/inet/inet6 fails with
# EAFNOSUPPORT, the answer of a kernel without that family, instead of EPERM. Tools that
# open the audit netlink socket (useradd, groupadd, passwd from shadow) abort on EPERM but
# carry on, as on a kernel without audit, on EAFNOSUPPORT; still no netlink socket opens.
_EAFNOSUPPORT = 97  # same value on x86_64 and aarch64
_BUILD_ARG_RULES: Mapping[str, tuple[_Insn, ...]] = MappingProxyType(
    {"socket": _socket_body(other_family=_ret(_RET_ERRNO | _EAFNOSUPPORT))})
# clone3's flags are in memory BPF cannot read; ENOSYS makes glibc fall back to clone.
# Linux AIO contexts count against one host-wide limit (fs.aio-max-nr), charged to no cgroup:
# one sandbox's io_setup calls could take them all from the host and every other sandbox.
# ENOSYS is a kernel without AIO, which libaio's users (databases, qemu) fall back from.
AIO = ("io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents")
_ENOSYS_NAMES = frozenset({"clone3", *AIO})
_ENOSYS_LINES = ("clone3: ENOSYS (its flags are in memory BPF cannot read; glibc falls back to clone)",
                 f"{', '.join(AIO)}: ENOSYS (AIO contexts are one host-wide limit, fs.aio-max-nr; "
                 "as on a kernel without AIO, programs fall back)")


def _resolve_arch(arch: str | None) -> str:
    machine = arch if arch is not None else platform.machine()
    name = _ARCH_ALIASES.get(machine.lower(), machine.lower())
    if name not in _ARCHES:
        raise HostUnsupported(
            f"no seccomp filter for architecture {machine!r} "
            f"(supported: {', '.join(SUPPORTED_ARCHES)})",
            missing=[f"seccomp syscall table for {machine}"],
        )
    return name


def _normalize_names(extra_deny: Iterable[str]) -> tuple[str, ...]:
    if isinstance(extra_deny, str):  # a lone name would otherwise be split into letters
        raise TypeError(f"extra_deny must be an iterable of syscall names, not {extra_deny!r}")
    names = set(extra_deny)
    for name in sorted(names, key=str):
        if name not in _ALL_NAMES:
            raise ValueError(f"unknown syscall name in extra_deny: {name!r}")
    return tuple(sorted(names))


# A verdict: a single ret instruction, or an argument rule's body (a tuple of instructions).
_Verdict = _Insn | tuple[_Insn, ...]


def verdicts(extra_deny: Iterable[str] = (), arch: str | None = None) -> dict[str, str]:
    """name -> "allow" | "rule" | "EPERM" | "ENOSYS" for every syscall in `arch`'s table."""
    plain = {_ALLOW: "allow", _DENY: "EPERM", _NOSYS: "ENOSYS"}
    table = _table_verdicts(_normalize_names(extra_deny), _resolve_arch(arch))
    return {sc: plain.get(v, "rule") for sc, (v, _nr) in table.items()}  # type: ignore[call-overload]


def _table_verdicts(extra: tuple[str, ...], arch: str, build: bool = False) -> dict[str, tuple[_Verdict, int]]:
    """The verdict of each syscall `arch`'s table knows. clone3 (and AIO) keep ENOSYS even when
    listed in extra_deny: EPERM would stop glibc's fallback to clone and so break thread creation."""
    allowed = set(ALLOWED) - set(extra)
    out: dict[str, tuple[_Verdict, int]] = {}
    for name, nr in SYSCALLS[arch].items():
        if name in _ENOSYS_NAMES:
            verdict: _Verdict = _NOSYS
        elif build and name in _BUILD_ARG_RULES and name not in extra:
            verdict = _BUILD_ARG_RULES[name]
        elif name in ARG_RULES and name not in extra:
            verdict = ARG_RULES[name][0]
        elif name in allowed:
            verdict = _ALLOW
        else:
            verdict = _DENY
        out[name] = (verdict, nr)
    return out


def _ranges(by_nr: dict[int, _Verdict]) -> list[tuple[int, _Verdict]]:
    """Cut [0, 2**32) into (first number, verdict) ranges; unknown numbers get ENOSYS."""
    out: list[tuple[int, _Verdict]] = []
    nr = 0
    for n in sorted(by_nr):
        if n > nr:
            out.append((nr, _NOSYS))
        out.append((n, by_nr[n]))
        nr = n + 1
    out.append((nr, _NOSYS))
    merged: list[tuple[int, _Verdict]] = []
    for start, v in out:
        # Argument rules stay one leaf per syscall; equal plain verdicts merge.
        if merged and merged[-1][1] == v and v in (_ALLOW, _DENY, _NOSYS):
            continue
        merged.append((start, v))
    return merged


def _tree(ranges: list[tuple[int, _Verdict]]) -> list[_Insn]:
    """Binary search over `ranges` with the syscall number in the accumulator."""
    if len(ranges) == 1:
        v = ranges[0][1]
        return [v] if v in (_ALLOW, _DENY, _NOSYS) else list(v)  # type: ignore[list-item]
    mid = len(ranges) // 2
    left, right = _tree(ranges[:mid]), _tree(ranges[mid:])
    split = ranges[mid][0]
    if len(left) <= 255:
        return [_jump(_BPF_JGE_K, split, len(left), 0), *left, *right]
    return [_jump(_BPF_JGE_K, split, 0, 1), _stmt(_BPF_JA, len(left)), *left, *right]


@functools.lru_cache(maxsize=32)
def _build(extra: tuple[str, ...], arch: str, build: bool = False) -> bytes:
    by_nr = {nr: v for v, nr in _table_verdicts(extra, arch, build).values()}
    prog: list[_Insn] = [
        _stmt(_BPF_LD_W_ABS, _OFF_ARCH),
        _jump(_BPF_JEQ_K, _ARCHES[arch], 1, 0),
        _ret(_RET_KILL_PROCESS),
        _stmt(_BPF_LD_W_ABS, _OFF_NR),
        *_tree(_ranges(by_nr)),
    ]
    _check(prog)
    return b"".join(struct.pack("<HBBI", *insn) for insn in prog)


def _check(prog: list[_Insn]) -> None:
    """Refuse to emit a program the kernel would reject, so mistakes fail at build time."""
    if not 0 < len(prog) <= _BPF_MAXINSNS:
        raise ValueError(f"seccomp program has {len(prog)} instructions (max {_BPF_MAXINSNS})")
    for pc, (code, jt, jf, k) in enumerate(prog):
        if code == _BPF_JA:
            reach = k
        elif code & 0x07 == 0x05:  # conditional jumps of the BPF_JMP class
            reach = max(jt, jf)
            if reach > 255:
                raise ValueError(f"seccomp program jump too long at instruction {pc}")
        else:
            continue
        if pc + 1 + reach >= len(prog):
            raise ValueError(f"seccomp program jump out of range at instruction {pc}")
    if prog[-1][0] != _BPF_RET_K:
        raise ValueError("seccomp program must end in a return")


def build_filter(extra_deny: Iterable[str] = (), arch: str | None = None, *, build: bool = False) -> bytes:
    """Return the filter as raw `struct sock_filter[]` bytes for `arch` (default: this host).

    Allows ALLOWED and the argument rules (ARG_RULES) minus `extra_deny`; every other syscall
    of the arch's table fails with EPERM, clone3 and numbers the table lacks with ENOSYS.
    `build`: the build sandboxes' variant, the same but for socket families outside
    unix/inet/inet6, which fail with EAFNOSUPPORT (see _BUILD_ARG_RULES).
    Cached: a runtime builds the filter once and each sandbox's zygote loads it once.

    Raises ValueError for a name unknown on every supported arch (a name only another arch has
    is skipped), and HostUnsupported for an arch without a syscall table here.
    """
    return _build(_normalize_names(extra_deny), _resolve_arch(arch), build)


def filter_length(prog: bytes) -> int:
    """Number of instructions in `prog`: the `len` field of `struct sock_fprog`."""
    if len(prog) % 8:
        raise ValueError(f"seccomp program size {len(prog)} is not a multiple of 8 bytes")
    return len(prog) // 8


def describe(extra_deny: Iterable[str] = (), arch: str | None = None) -> list[str]:
    """What `build_filter(extra_deny, arch)` does, one line per rule, for a doctor report."""
    name = _resolve_arch(arch)
    extra = _normalize_names(extra_deny)
    table = SYSCALLS[name]
    v = verdicts(extra, name)
    allowed = sorted(n for n, x in v.items() if x == "allow")
    lines = [
        f"syscalls of other ABIs than {name} (audit arch {_ARCHES[name]:#x}): kill process",
        f"{len(allowed)} of the {len(table)} {name} syscalls allowed; the others: EPERM",
        f"syscall numbers the {name} table does not know (newer kernels): ENOSYS",
    ]
    lines += [line for n, (_b, line) in ARG_RULES.items() if v.get(n) == "rule"]
    lines += _ENOSYS_LINES
    denied = sorted(n for n in (*NOTABLY_DENIED, *extra) if v.get(n) == "EPERM")
    lines += [f"{n}: EPERM" for n in dict.fromkeys(denied)]
    return lines
