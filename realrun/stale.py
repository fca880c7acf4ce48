"""What a dead run left behind, removed: its network namespaces (:mod:`realrun.netns`),
rank processes and temporary folders (:mod:`realrun.owner`), found by the owner's tag
that each carries. Apart from both so that neither imports the other."""

from __future__ import annotations

import os
import shutil
import tempfile

from realrun import netns, owner


def netns_prefixes() -> tuple[str, ...]:
    """The namespace prefixes this user's runs use: ``DTSIM_NETNS_PREFIX`` (default
    ``dtsim``) and the calibration's loopback variant (the same plus ``l``)."""
    base = os.environ.get("DTSIM_NETNS_PREFIX", "dtsim")
    return (base, base + "l")


def remove_stale(prefixes: tuple[str, ...] | None = None, tmp: str | None = None) -> owner.Removed:
    """Remove what dead runs left (see module docs): namespaces with ``prefixes`` (default
    :func:`netns_prefixes`) whose creator is gone, with the processes inside; rank
    processes whose owner is gone; temporary folders in ``tmp`` (default: the temporary
    directory) whose owner is gone."""
    removed = owner.Removed()
    for prefix in prefixes or netns_prefixes():
        for name in netns.remove_stale(prefix):
            removed.namespaces.append(name)
            removed.owners.add("-".join(name[len(prefix) + 1 :].split("-")[:2]))
    procs = owner.stale_processes()
    if procs:
        owner.kill_all(list(procs))
        removed.processes = sorted(procs)
        removed.owners.update(procs.values())
    for path, tag in sorted(owner.stale_folders(tmp or tempfile.gettempdir()).items()):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            removed.folders.append(path)
            removed.owners.add(tag)
    return removed
