"""Build sandboxes (Dockerfile RUN steps, Debian configure steps) keep the guarantees of
every sandbox, as root of their own user namespace: no capabilities, no_new_privs,
seccomp, no host-global knobs, nothing of the host visible, and no write outside the
step's own layer."""

from __future__ import annotations

import os

import pytest
from oci_archives import base_entries, docker_save, image_config, layer_tar

from tryloop.sandbox.dockerfile import BuildOptions, run_build_step
from tryloop.sandbox.oci import import_archive

PROBE = r"""
while read k v rest; do case $k in CapInh:|CapPrm:|CapEff:|CapBnd:|CapAmb:|NoNewPrivs:|Seccomp:|Uid:) echo "$k$v";; esac
done < /proc/self/status
read a b c < /proc/self/uid_map; echo "map:$a:$b:$c"
for f in /proc/sys/kernel/core_pattern /proc/sys/vm/drop_caches /proc/sys/kernel/panic /proc/sysrq-trigger; do
  if (exec 3>>"$f") 2>/dev/null; then echo "WRITABLE $f"; fi
done
for p in /proc/[0-9]*; do echo "pid:${p#/proc/}"; done
ls / | while read e; do echo "root:$e"; done
echo pwned > /bin/cat; rm /etc/passwd; echo changed > /etc/group; touch /made-by-root
"""


@pytest.fixture(scope="module")
def base(build_runtime, tmp_path_factory):
    layers = [layer_tar(base_entries(tools=("cat", "ls", "rm", "touch")))]
    path = docker_save(tmp_path_factory.mktemp("sec") / "base.tar", layers, image_config(layers, env=["PATH=/bin"]))
    return import_archive(build_runtime.store, path)


async def test_build_step_is_confined_as_root_of_its_namespace(build_runtime, base):
    store = build_runtime.store
    before = {d: store.verify(d) for d in base.layers}
    out: list[bytes] = []
    layer = await run_build_step(build_runtime, list(base.layers), dict(base.env), ["/bin/sh", "-c", PROBE],
                                 options=BuildOptions(network=False), on_output=lambda _n, c: out.append(c))
    lines = b"".join(out).decode().splitlines()
    fields = dict(x.split(":", 1) for x in lines if x.split(":", 1)[0] in
                  ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "Uid", "map"))
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(fields[cap], 16) == 0, (cap, fields)
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    assert fields["Uid"] == "0"  # root of the namespace ...
    inside, outside, count = fields["map"].split(":")
    assert inside == "0" and int(outside) >= 1 << 16 and count == "65536"  # ... an unused host id range
    assert not [x for x in lines if x.startswith("WRITABLE")]
    assert len([x for x in lines if x.startswith("pid:")]) <= 4  # init, shell, a subshell: no host process
    roots = {x[5:] for x in lines if x.startswith("root:")}
    assert "home" not in roots and "usr" not in roots and "bin" in roots  # the image, not the host
    # The step's writes went to its own layer, with the image's ids: the layers below
    # and the host are untouched.
    assert all(store.verify(d) for d in base.layers) and all(before.values())
    top = store.path(layer)
    assert (top / "bin/cat").read_text() == "pwned\n" and os.stat(top / "made-by-root").st_uid == 0
    wh = os.lstat(top / "etc/passwd")
    assert wh.st_rdev == 0 and (wh.st_mode & 0o170000) == 0o020000  # a whiteout
    assert b"pwned" not in (store.path(base.layers[0]) / "bin/cat").read_bytes()[:64]

