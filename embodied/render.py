"""Offscreen frames (RGB ``uint8 [H, W, 3]``) drawn with matplotlib, and video writing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from embodied.core.errors import UserError


def _figure(size=(4.8, 4.8), dpi=80, projection=None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=size, dpi=dpi)
    ax = fig.add_subplot(111, projection=projection)
    return fig, ax


def _to_rgb(fig) -> np.ndarray:
    import matplotlib.pyplot as plt

    fig.canvas.draw()
    rgb = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return rgb


def quadrotor_frame(pos: np.ndarray, rotmat: np.ndarray, trail: np.ndarray, t: float, radius: float) -> np.ndarray:
    """3D view of one quadrotor: arms (X configuration, drawn 4x enlarged), thrust axis, trail."""
    fig, ax = _figure(projection="3d")
    lim = 0.6
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_zlim(-lim, lim)
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.set_zlabel("z [m]")
    arm = 0.028 * 4
    rotors = np.array([[1, -1, 0], [-1, -1, 0], [-1, 1, 0], [1, 1, 0]], dtype=float) * arm
    world = pos + rotors @ rotmat.T
    for i, c in zip(range(4), ("tab:red", "tab:blue", "tab:blue", "tab:red")):
        ax.plot(*zip(pos, world[i]), color=c, linewidth=3)
    up = pos + rotmat[:, 2] * arm
    ax.plot(*zip(pos, up), color="k", linewidth=1.5)
    if len(trail) > 1:
        ax.plot(trail[:, 0], trail[:, 1], trail[:, 2], color="tab:gray", linewidth=0.8)
    u = np.linspace(0, 2 * np.pi, 40)
    ax.plot(radius * np.cos(u), radius * np.sin(u), 0 * u, color="tab:green", linewidth=0.8)
    ax.scatter([0], [0], [0], color="tab:green", s=12)
    ax.set_title(f"t = {t:4.2f} s   |p| = {np.linalg.norm(pos):.3f} m")
    return _to_rgb(fig)


def pendulum_frame(theta: float, t: float) -> np.ndarray:
    fig, ax = _figure(size=(3.2, 3.2))
    ax.set_xlim(-1.2, 1.2)
    ax.set_ylim(-1.2, 1.2)
    ax.set_aspect("equal")
    ax.plot([0, np.sin(theta)], [0, np.cos(theta)], color="tab:red", linewidth=4)
    ax.scatter([0], [0], color="k", s=20)
    ax.set_title(f"t = {t:4.2f} s")
    return _to_rgb(fig)


def write_video(frames: list[np.ndarray], path: Path, fps: int) -> Path:
    """mp4 (MPEG-4 Part 2) through OpenCV's own encoder, no ffmpeg needed; GIF through Pillow; other suffixes
    through imageio."""
    import imageio.v2 as imageio

    path = Path(path)
    if path.suffix == ".mp4":
        import cv2

        h, w = frames[0].shape[:2]
        h2, w2 = h + h % 2, w + w % 2  # the codec wants even sizes
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), float(fps), (w2, h2))
        if not writer.isOpened():
            raise UserError(f"OpenCV cannot write the video {path}")
        for f in frames:
            f = np.pad(np.asarray(f, np.uint8)[..., :3], ((0, h2 - h), (0, w2 - w), (0, 0)))
            writer.write(cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
        writer.release()
    elif path.suffix == ".gif":
        imageio.mimsave(path, frames, duration=1.0 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps)
    return path
