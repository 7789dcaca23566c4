"""The Soft-RoCE lab: Debian's kernel and rdma-core userland, unpacked under build/rdma-lab.

Nothing is installed on the host except QEMU (when missing and we are root): the kernel and the
rdma packages are fetched with `apt-get download` and unpacked with `dpkg -x`. The guest later
runs the host's own userland with these packages layered on top (see guest.py).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAB = Path(os.environ.get("DICOMM_RDMA_LAB", REPO / "build" / "rdma-lab"))
# Userland layered over the host root in the guest. libibverbs-dev only supplies headers for the
# ABI check of dicomm's own verbs declarations; python3-pyverbs is the independent reference.
USER_PACKAGES = ["busybox-static", "kmod", "libkmod2", "libibverbs1", "ibverbs-providers", "rdma-core",
                 "ibverbs-utils", "perftest", "librdmacm1", "libpci3", "libibverbs-dev", "python3-pyverbs",
                 "libibumad3"]  # libibumad3: perftest's ib_send_lat links it
# Stage 1 needs only virtio, 9p and overlay; everything else is loaded from the full module tree.
INITRD_MODULES = ["drivers/virtio/virtio.ko", "drivers/virtio/virtio_ring.ko", "drivers/virtio/virtio_pci.ko",
                  "drivers/virtio/virtio_pci_modern_dev.ko", "drivers/virtio/virtio_pci_legacy_dev.ko",
                  "fs/netfs/netfs.ko", "fs/fscache/fscache.ko", "net/9p/9pnet.ko", "net/9p/9pnet_virtio.ko",
                  "fs/9p/9p.ko", "fs/overlayfs/overlay.ko"]


class Unavailable(RuntimeError):
    """QEMU or the Debian packages cannot be obtained here (the caller skips, saying why)."""


def _run(cmd: list[str], what: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{what}: {e}") from e
    if p.returncode != 0:
        raise Unavailable(f"{what} failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")
    return p.stdout


def ensure_qemu() -> str:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu:
        return qemu
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable("qemu-system-x86_64 is not installed and cannot be installed here (needs root and apt-get)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    inst = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "qemu-system-x86"]
    try:
        _run(inst, "apt-get install qemu-system-x86", env=env)
    except Unavailable:
        _run(["apt-get", "update", "-q"], "apt-get update", env=env)
        _run(inst, "apt-get install qemu-system-x86", env=env)
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise Unavailable("qemu-system-x86 installed but qemu-system-x86_64 is not on PATH")
    return qemu


def _kernel_package() -> str:
    out = _run(["apt-cache", "depends", "linux-image-amd64"], "apt-cache depends linux-image-amd64")
    for line in out.splitlines():
        parts = line.split()
        if (len(parts) == 2 and parts[0] == "Depends:" and parts[1].startswith("linux-image-")
                and parts[1][12:13].isdigit()):
            return parts[1]
    raise Unavailable("apt-cache knows no kernel package behind linux-image-amd64 (run apt-get update)")


def download() -> None:
    debs = LAB / "debs"
    done = debs / ".complete"
    if done.exists() and done.read_text().split()[1:] == USER_PACKAGES:
        return
    names = [_kernel_package()] + USER_PACKAGES
    if not shutil.which("apt-get"):
        raise Unavailable("apt-get is not available: the Debian kernel and rdma packages cannot be fetched")
    debs.mkdir(parents=True, exist_ok=True)
    cmd = ["apt-get", "-q", "-o", "APT::Sandbox::User=root", "download", *names]
    try:
        _run(cmd, "apt-get download", cwd=debs)
    except Unavailable:  # stale package lists: refresh once
        _run(["apt-get", "update", "-q"], "apt-get update")
        _run(cmd, "apt-get download", cwd=debs)
    done.write_text("\n".join(names) + "\n")
    (LAB / "kernel.version").unlink(missing_ok=True)  # unpack again with the new set


def _merge_usr(root: Path) -> None:
    # The host is merged-/usr: a real bin/ or lib/ in an upper overlay layer would hide its symlinks.
    for d in ("bin", "sbin", "lib", "lib64"):
        src = root / d
        if src.is_dir() and not src.is_symlink():
            dst = root / "usr" / d
            dst.mkdir(parents=True, exist_ok=True)
            _run(["cp", "-a", f"{src}/.", f"{dst}/"], f"merge {d} into usr/{d}")
            shutil.rmtree(src)


def extract() -> str:
    """Unpacks kernel, busybox and userland; returns the kernel version."""
    stamp = LAB / "kernel.version"
    if stamp.exists():
        return stamp.read_text().strip()
    for d in ("kernel", "pkgroot", "bb"):
        shutil.rmtree(LAB / d, ignore_errors=True)
        (LAB / d).mkdir(parents=True)
    for deb in sorted((LAB / "debs").glob("*.deb")):
        if deb.name.startswith("linux-image-"):
            target = "kernel"
        else:
            target = "bb" if deb.name.startswith("busybox-static") else "pkgroot"
        _run(["dpkg", "-x", str(deb), str(LAB / target)], f"dpkg -x {deb.name}")
    _merge_usr(LAB / "pkgroot")
    kv = os.listdir(LAB / "kernel" / "lib" / "modules")[0]
    # kmod's modprobe needs the binary indexes, which busybox's depmod does not write.
    tools = LAB / "hosttools"
    tools.mkdir(exist_ok=True)
    depmod = tools / "depmod"
    if not depmod.exists():
        depmod.symlink_to(LAB / "pkgroot" / "usr" / "bin" / "kmod")
    env = dict(os.environ, LD_LIBRARY_PATH=str(LAB / "pkgroot" / "usr" / "lib" / "x86_64-linux-gnu"))
    _run([str(depmod), "-b", str(LAB / "kernel"), kv], "depmod", env=env)
    stamp.write_text(kv + "\n")
    return kv


def build_initramfs(kv: str) -> Path:
    out = LAB / "initramfs.cpio.gz"
    init = Path(__file__).with_name("guest_init.sh")
    if out.exists() and out.stat().st_mtime > init.stat().st_mtime:
        return out
    stage = LAB / "initramfs.d"
    shutil.rmtree(stage, ignore_errors=True)
    for d in ("bin", "dev", "proc", "sys", f"lib/modules/{kv}"):
        (stage / d).mkdir(parents=True)
    busybox = LAB / "bb" / "bin" / "busybox"
    shutil.copy2(busybox, stage / "bin" / "busybox")
    shutil.copy2(init, stage / "init")
    (stage / "init").chmod(0o755)
    mods = LAB / "kernel" / "lib" / "modules" / kv / "kernel"
    for m in INITRD_MODULES:
        dst = stage / "lib" / "modules" / kv / "kernel" / m
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(mods / m, dst)
    _run([str(busybox), "depmod", "-b", str(stage), kv], "busybox depmod")
    # The kernel opens /dev/console before /init runs: the node must be in the archive.
    os.mknod(stage / "dev" / "console", 0o600 | 0o020000, os.makedev(5, 1))
    os.mknod(stage / "dev" / "null", 0o666 | 0o020000, os.makedev(1, 3))
    files = subprocess.run(["find", "."], cwd=stage, capture_output=True, check=True).stdout
    cpio = subprocess.run([str(busybox), "cpio", "-o", "-H", "newc", "-R", "0:0"], cwd=stage, input=files,
                          capture_output=True)
    if cpio.returncode != 0:
        raise Unavailable(f"cpio failed: {cpio.stderr.decode()[-400:]}")
    import gzip
    out.write_bytes(gzip.compress(cpio.stdout, compresslevel=1))
    return out


NATIVE_SOURCES = ["transport/verbs/*.cpp", "transport/acceptor.cpp", "transport/socket.cpp", "transport/poller.cpp",
                  "core/handshake.cpp", "core/hmac.cpp", "core/log.cpp", "core/card.cpp", "core/types.cpp",
                  "core/config.cpp", "transport/registry.cpp"]


def build_native() -> Path:
    """Builds the test programs of tests/rdma/native against dicomm's sources (not the installed
    module, so they test the tree as it is). Compiler errors are failures, not skips."""
    import glob
    out = LAB / "bin"
    out.mkdir(parents=True, exist_ok=True)
    csrc = REPO / "dicomm" / "csrc"
    native = Path(__file__).with_name("native")
    sources = sorted(p for pat in NATIVE_SOURCES for p in glob.glob(str(csrc / pat)))
    exe = out / "verbs_pingpong"
    inputs = [native / "verbs_pingpong.cpp", *map(Path, sources), *csrc.glob("**/*.h")]
    if not exe.exists() or max(p.stat().st_mtime for p in inputs) > exe.stat().st_mtime:
        p = subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", f"-I{csrc}", "-o", str(exe),
                            str(native / "verbs_pingpong.cpp"), *sources, "-ldl", "-lpthread"],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"building verbs_pingpong failed:\n{p.stderr[-4000:]}")
    return out


def unavailable_reason() -> str | None:
    """None once the lab is prepared; otherwise why it cannot be (for a command line to print)."""
    try:
        prepare()
    except Unavailable as e:
        return str(e)
    return None


def abi_check() -> str:
    """Compiles native/abi_check.cpp against rdma-core's own header; '' if it matches, else why."""
    inc = LAB / "pkgroot" / "usr" / "include"
    p = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", "-Wno-enum-compare", f"-I{REPO / 'dicomm' / 'csrc'}",
                        f"-I{inc}", str(Path(__file__).with_name("native") / "abi_check.cpp")],
                       capture_output=True, text=True, timeout=300)
    return "" if p.returncode == 0 else p.stderr[-4000:]


def prepare() -> dict:
    """Everything the guest needs; raises Unavailable when it cannot be obtained."""
    qemu = ensure_qemu()
    download()
    kv = extract()
    initrd = build_initramfs(kv)
    kernel = LAB / "kernel" / "boot" / f"vmlinuz-{kv}"
    if not kernel.exists():
        raise Unavailable(f"no kernel image at {kernel.relative_to(REPO) if kernel.is_relative_to(REPO) else kernel}")
    return {"qemu": qemu, "kernel": kernel, "initrd": initrd, "kv": kv}
