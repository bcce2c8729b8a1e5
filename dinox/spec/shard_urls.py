"""Which shard locations a spec may name, and how they are opened: never through a shell.

webdataset opens a URL by its scheme: ``pipe:`` hands the rest of the string to ``/bin/sh``, and its other
remote schemes (``gs:``, ``hf:``, ``ais:``, ``sftp:`` ...) start ``curl``, ``gsutil`` or other programs with
the URL on their command line (a leading ``-`` or curl's own ``{}``/``[]`` globbing would then be
options or patterns, not a location). A spec is data, so dinox accepts only local paths (a folder, a
glob, a brace pattern) and ``http(s)://`` URLs, which it opens itself with urllib (no subprocess); every
other scheme is refused when the spec is validated. Torch-free: ``spec.py`` validates with it.
"""

from __future__ import annotations

import itertools
import re
from urllib.parse import urlparse

REMOTE_SCHEMES = ("http", "https")
MAX_SHARDS = 100_000
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")  # urllib would refuse these in a URL anyway


_RANGE = re.compile(r"\{(-?\w+)\.\.(-?\w+)(?:\.\.-?\d+)?\}")


def _at_most(shards: str) -> int:
    """An upper bound on how many names a brace pattern expands to, without expanding it (braceexpand builds
    each range whole: ``{0..99999999}`` would take half a minute before any limit could stop it)."""
    bound = 1
    for low, high in _RANGE.findall(shards):
        try:
            bound *= abs(int(high) - int(low)) + 1
        except ValueError:
            bound *= 128  # a character range, {a..z}
    for group in re.findall(r"\{([^{}]*,[^{}]*)\}", shards):
        bound *= group.count(",") + 1
    return bound


def expand(shards: str, limit: int = MAX_SHARDS) -> list[str]:
    """A brace pattern (``a-{000..009}.tar``) expanded by braceexpand, the library webdataset expands with,
    refusing more than `limit` names. Raises ValueError for such a pattern, or one braceexpand cannot read.
    Not webdataset's own ``expand_urls``: it also substitutes ``WDS_`` environment variables (one spec would
    name other shards on another host, and a variable could carry a scheme past this check) and has no limit."""
    import braceexpand

    if _at_most(shards) > limit:
        raise ValueError(f"{shards!r} expands to more than {limit} shards")
    try:
        urls = list(itertools.islice(braceexpand.braceexpand(shards), limit + 1))
    except braceexpand.UnbalancedBracesError as e:
        raise ValueError(f"unbalanced braces in {shards!r} ({e})") from None
    if len(urls) > limit:
        raise ValueError(f"{shards!r} expands to more than {limit} shards")
    return urls


def scheme(url: str) -> str:
    """The URL scheme webdataset's gopen would dispatch on ('' for a local path)."""
    return urlparse(url).scheme.lower()


def problem(shards: str) -> str | None:
    """Why `shards` cannot be read safely, or None. Checks every expansion of a brace pattern: the scheme
    itself may sit inside braces (``{pipe:x,a}.tar``)."""
    try:
        urls = expand(shards)
    except ValueError as e:
        return str(e)
    for url in urls:
        kind = scheme(url)
        if kind in REMOTE_SCHEMES:
            if _SPACE_OR_CONTROL.search(url):
                return f"{url!r}: a URL holds no whitespace or control characters (percent-encode them)"
            if not urlparse(url).netloc:
                return f"{url!r}: an {kind} URL needs a host"
        elif kind == "file":
            return f"{url!r}: give the local path itself, without file://"
        elif kind:
            return (
                f"scheme {kind}: is not accepted (only local paths, globs, brace patterns and http(s):// URLs; "
                f"dinox never hands a location to a shell or another program)"
            )
        elif _CONTROL.search(url):
            return f"{url!r}: a path holds no control characters"
    return None


def open_http(url: str, mode: str = "rb", bufsize: int = 8192, **_kw):
    """webdataset's opener for http(s), replacing its ``curl`` subprocess: a streamed urllib response."""
    import urllib.request

    if mode != "rb":
        raise ValueError(f"{url}: dinox reads shards only (mode {mode!r})")
    if scheme(url) not in REMOTE_SCHEMES:
        raise ValueError(f"{url}: not an http(s) URL")
    return urllib.request.urlopen(url, timeout=60)  # noqa: S310 - the scheme is checked just above


def install_openers() -> None:
    """Route webdataset's http(s) through `open_http` and disable every scheme that starts a program,
    in this process and the DataLoader workers it forks."""
    import importlib

    gopen = importlib.import_module("webdataset.gopen")  # the package re-exports a function of that name
    for name in list(gopen.gopen_schemes):
        if name != "__default__":
            gopen.gopen_schemes[name] = gopen.gopen_error
    for name in REMOTE_SCHEMES:
        gopen.gopen_schemes[name] = open_http
