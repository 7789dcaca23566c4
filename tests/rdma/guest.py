"""Boots the Soft-RoCE guest once and runs one shell command in it, in the repository.

The guest is Debian's stock kernel under QEMU (TCG: a kvm device without vmx/svm cannot run a
stock kernel) with `-smp 2` (busy-polling verbs needs a second vCPU), the host's root over
virtio-9p read-only under a tmpfs overlay (the guest runs the host's venv and checkout), user
networking with restrict=on (the guest reaches nothing outside), and rxe0 on eth0.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.rdma import lab


@dataclass
class GuestResult:
    rc: int | None       # the command's exit status; None if the guest never reported one
    output: str          # the command's stdout and stderr
    console: str         # the guest's serial console (boot messages, stage-2 log)
    seconds: float       # boot to poweroff
    files: dict          # what the command wrote under $RESULTS, by file name

    def describe(self) -> str:
        return f"guest command exit {self.rc} after {self.seconds:.0f} s\n--- output ---\n{self.output[-6000:]}" \
               f"\n--- console ---\n{self.console[-3000:]}"


def _accel() -> list[str]:
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    kvm = os.access("/dev/kvm", os.W_OK) and (" vmx" in flags or " svm" in flags)
    if kvm and os.environ.get("DICOMM_RDMA_ACCEL") != "tcg":
        return ["-accel", "kvm", "-cpu", "host"]
    return ["-accel", "tcg,thread=multi", "-cpu", "max"]


def run(command: str, timeout_s: float = 240, mem_mb: int = 1024) -> GuestResult:
    """Runs `command` (bash) in the guest, in the repository, with $RESULTS a folder whose files come
    back in GuestResult.files; QEMU is killed at `timeout_s` whatever the guest does."""
    env = lab.prepare()
    run_dir = lab.LAB / "runs" / f"{os.getpid()}-{int(time.time() * 1000)}"
    run_dir.mkdir(parents=True)
    (run_dir / "cmd.sh").write_text(command + "\n")
    stage2 = Path(__file__).with_name("guest_stage2.sh")
    append = ("console=ttyS0 quiet panic=-1 mitigations=off random.trust_cpu=on tsc=reliable clocksource=tsc "
              f"rdmalab={lab.LAB} "
              f"stage2={stage2} rdmarun={run_dir} rdmarepo={lab.REPO}")
    cmd = [env["qemu"], *_accel(), "-smp", "2", "-m", str(mem_mb), "-M", "pc", "-nodefaults", "-no-user-config",
           "-display", "none", "-serial", "stdio", "-no-reboot",
           "-kernel", str(env["kernel"]), "-initrd", str(env["initrd"]), "-append", append,
           "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
           "-virtfs", f"local,path={lab.LAB / 'pkgroot'},mount_tag=pkgs,security_model=none,readonly=on",
           "-virtfs", f"local,path={lab.LAB},mount_tag=lab,security_model=none",
           "-netdev", "user,id=n0,restrict=on", "-device", "virtio-net-pci,netdev=n0"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        console, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        console, _ = proc.communicate()
        console += f"\n[host] guest killed after {timeout_s:.0f} s".encode()
    seconds = time.monotonic() - t0
    rc_file, out_file = run_dir / "rc", run_dir / "output.txt"
    rc = int(rc_file.read_text()) if rc_file.exists() else None
    output = out_file.read_text(errors="replace") if out_file.exists() else ""
    results = run_dir / "results"
    files = {p.name: p.read_text(errors="replace") for p in results.iterdir()} if results.is_dir() else {}
    shutil.rmtree(run_dir, ignore_errors=True)
    return GuestResult(rc, output, console.decode(errors="replace"), seconds, files)


if __name__ == "__main__":  # python -m tests.rdma.guest 'ibv_devinfo'
    import sys
    res = run(" ".join(sys.argv[1:]) or "ibv_devinfo -v")
    print(res.describe())
    sys.exit(0 if res.rc == 0 else 1)
