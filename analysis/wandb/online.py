"""Is wandb online here? Answered from the environment and ``wandb login``'s netrc entry,
without importing wandb (so a command that needs it can refuse in milliseconds)."""

from __future__ import annotations

import netrc
import os
from urllib.parse import urlparse

OFF = ("offline", "disabled", "dryrun")


def logged_in() -> bool:
    """An API key for wandb's host is at hand (``WANDB_API_KEY``, an identity token file,
    or the netrc entry ``wandb login`` writes)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode() -> str:
    """``WANDB_MODE`` when set, else online when logged in, else offline."""
    return os.environ.get("WANDB_MODE") or ("online" if logged_in() else "offline")


def why_not_online(entity: str | None) -> str | None:
    """One line saying why an online-only command cannot run (None: it can)."""
    if not entity:
        return "ENTITY is missing: pass ENTITY=<your wandb user or team> (--entity)"
    mode = os.environ.get("WANDB_MODE", "")
    if mode.lower() in OFF:
        return f"WANDB_MODE={mode}: a report lives on the wandb server; unset WANDB_MODE (or set it to online)"
    if not logged_in():
        return "not logged in to wandb: run `.venv/bin/wandb login` (or set WANDB_API_KEY), then `make wandb-sync`"
    return None
