"""Evaluation under other task settings (env.KEY=VALUE) and instruction captions on video frames."""

from __future__ import annotations

import numpy as np
import pytest

from embodied.config import load_config
from embodied.core.errors import UserError
from embodied.evaluate_run import apply_env_overrides, caption


def test_env_overrides_set_task_settings_and_reject_others():
    cfg = load_config("point-reach-language", None, [])
    apply_env_overrides(cfg, ["env.phrasing=heldout", "env.tolerance=0.2"])
    assert cfg.env.phrasing == "heldout" and cfg.env.tolerance == 0.2
    for bad in ("env.nope=1", "seed=3", "env.phrasing"):
        with pytest.raises(UserError, match="env.KEY=VALUE"):
            apply_env_overrides(cfg, [bad])


def test_caption_writes_on_a_dark_band_and_keeps_the_frame():
    frame = np.full((120, 160, 3), 200, np.uint8)
    out = caption(frame.copy(), "pick up the red cube and place it on the plate")
    assert out.shape == frame.shape and out.dtype == np.uint8
    assert (out[-40:] == 200).all()  # below the band: untouched
    band = out[: int(np.flatnonzero((out != 200).any(axis=(1, 2))).max()) + 1]
    assert band.min() < 100 and band.max() > 230  # darkened, with white text
