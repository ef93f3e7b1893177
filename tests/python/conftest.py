"""Real tiermemd daemons for the python suite (meson test sets TIERMEMD,
TIERMEMCTL and PYTHONPATH=build/client/python)."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest

import tiermem

TIERMEMD = os.environ.get("TIERMEMD", "tiermemd")
TIERMEMCTL = os.environ.get("TIERMEMCTL", "tiermemctl")


class Daemon:
    """One tiermemd in a temporary directory: config, socket, log; its DRAM
    and PMEM files on /dev/shm (persisting there is a memory copy)."""

    def __init__(self, dram="256MiB", pmem="128MiB", page_size="64KiB", vram=None):
        self.dir = tempfile.mkdtemp(prefix="tiermem-py-")
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else self.dir
        self.dram_dir = tempfile.mkdtemp(prefix="tiermem-dram-", dir=shm)
        self.pmem_dir = tempfile.mkdtemp(prefix="tiermem-pmem-", dir=shm)
        self.socket = os.path.join(self.dir, "tiermemd.sock")
        self.log_path = os.path.join(self.dir, "tiermemd.log")
        self.config = os.path.join(self.dir, "tiermemd.toml")
        with open(self.config, "w") as f:
            f.write(f'[node]\nid = 1\n[control]\nsocket = "{self.socket}"\n'
                    f'[mapping]\npage_size = "{page_size}"\n'
                    + ('[tiers.vram]\nenabled = false\n' if vram is None else
                       f'[tiers.vram]\nenabled = true\nrequired = true\ncapacity = "{vram}"\n') +
                    f'[tiers.dram]\ncapacity = "{dram}"\npath = "{self.dram_dir}"\n'
                    f'[tiers.pmem]\ncapacity = "{pmem}"\npath = "{self.pmem_dir}"\n'
                    f'[log]\nlevel = "info"\n')
        self.proc = None
        self.start()

    def start(self):
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen([TIERMEMD, "--config", self.config], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tiermemd exited with {self.proc.returncode}:\n{self.log()}")
            if os.path.exists(self.socket):
                try:
                    tiermem.connect(self.socket, name="probe").close()
                    return
                except tiermem.TransportError:
                    pass
            time.sleep(0.02)
        raise RuntimeError(f"tiermemd did not answer within 20 s:\n{self.log()}")

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def connect(self, **kw):
        return tiermem.connect(self.socket, **kw)

    def ctl(self, *args, check=True):
        r = subprocess.run([TIERMEMCTL, "--socket", self.socket, *args], capture_output=True)
        if check and r.returncode != 0:
            raise AssertionError(f"tiermemctl {' '.join(args)}: rc {r.returncode}: {r.stderr.decode()}")
        return r

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"tiermemd did not stop within 20 s of SIGTERM:\n{self.log()}")

    def close(self):
        try:
            self.stop()
        finally:
            for d in (self.dir, self.dram_dir, self.pmem_dir):
                shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    alive = d.proc.poll() is None
    d.close()
    assert alive, "tiermemd died during the tests:\n" + d.log()


@pytest.fixture
def client(daemon):
    with daemon.connect(name="pytest") as c:
        yield c
