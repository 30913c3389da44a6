"""Paths that a folder's own files name, kept inside that folder.

A model folder names other files in it: modules.json a module's subfolder
(`"path": "1_Pooling"`), a sharded checkpoint's `model.safetensors.index.json`
its shards (`"weight_map": {name: "model-00001-of-00002.safetensors"}`). Followed
as written, `"../../elsewhere"` or `"/etc"` would read files outside the folder
(a downloaded model could switch its pooling to a file it does not ship). So a
named path must be relative and stay below the folder once `..` is resolved.

The check is on the path as written, not on where symbolic links lead: the
Hugging Face cache keeps a snapshot's files as links into a shared blobs folder,
and those must still load.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from bertkit.errors import BertkitError


def inside(folder, name, where) -> Path:
    """folder / name, refused (naming `where`, the file that named it) unless `name` is a relative path
    that stays in `folder`."""
    if not isinstance(name, str):
        raise BertkitError(f"{where}: the path {name!r} is not a string; give a path relative to {folder}")
    normal = os.path.normpath(PurePosixPath(name.replace("\\", "/")).as_posix())
    if os.path.isabs(name) or name.startswith(("/", "\\")) or normal == ".." or normal.startswith("../") \
            or (len(name) > 1 and name[1] == ":"):
        raise BertkitError(f"{where} names {name!r}, outside its folder {folder}: a model folder's files may "
                           "name only paths inside it")
    return Path(folder) / ("" if normal == "." else normal)
