"""A driving frame for videos: the camera views beside a top-down map of the route, the car and the obstacles,
drawn with OpenCV."""

from __future__ import annotations

import math

import numpy as np


def drive_frame(env, i: int = 0, size: int = 256) -> np.ndarray:
    """``uint8 [size, W, 3]``: env ``i``'s cameras (stacked, scaled to ``size`` high) and a map of its route."""
    import cv2

    cams = env.sim.render(env._all_ids[i:i + 1])[0]  # [cams, 3, H, W]
    views = [np.ascontiguousarray((c.permute(1, 2, 0).clamp(0, 1).cpu().numpy() * 255).astype(np.uint8))
             for c in cams]
    h, w = views[0].shape[:2]
    scale = size / (h * len(views))
    views = [cv2.resize(v, (int(w * scale), int(h * scale)), interpolation=cv2.INTER_NEAREST) for v in views]
    left = np.concatenate(views, 0)
    left = cv2.resize(left, (left.shape[1], size), interpolation=cv2.INTER_NEAREST)
    routes, s = env.sim.routes, int(env.sim.scene[i])
    pts = routes.points[s, :int(routes.num_points[s])].cpu().numpy()
    x = env.sim.x[i].cpu().numpy()
    lo, hi = x[:2] - 20.0, x[:2] + 20.0  # a 40 m window around the car
    k = (size - 8) / float(max(hi - lo))

    def px(p):
        p = np.asarray(p, float).reshape(-1, 2)
        return np.stack([(p[:, 0] - lo[0]) * k + 4, size - 4 - (p[:, 1] - lo[1]) * k], 1).astype(np.int32)

    m = np.full((size, size, 3), 235, np.uint8)
    half = float(routes.half_width[s])
    cv2.polylines(m, [px(pts)], False, (120, 120, 120), max(1, int(2 * half * k)))
    cv2.polylines(m, [px(pts)], False, (250, 250, 250), 1)
    for box, ok in zip(routes.boxes[s].cpu().numpy(), routes.box_mask[s].cpu().numpy()):
        if ok:
            _rect(cv2, m, px, box[:2], box[2], box[3], box[4], (200, 60, 40))
    for box in env.sim.mover_boxes()[i].cpu().numpy():
        _rect(cv2, m, px, box[:2], box[2], box[3], box[4], (220, 160, 30))
    p = env.params
    centre = x[:2] + (0.5 * p.length - p.rear_overhang) * np.array([math.cos(x[2]), math.sin(x[2])])
    _rect(cv2, m, px, centre, x[2], 0.5 * p.length, 0.5 * p.width, (30, 90, 220))
    cv2.putText(m, f"{x[3]:4.1f} m/s  t={int(env.episode_length[i]) * env.control_dt:4.1f}s", (6, 16),
                cv2.FONT_HERSHEY_SIMPLEX, 0.4, (0, 0, 0), 1, cv2.LINE_AA)
    return np.concatenate([left, m], 1)


def _rect(cv2, img, px, centre, yaw, hl, hw, colour):
    c, s = math.cos(yaw), math.sin(yaw)
    corners = [(centre[0] + c * a - s * b, centre[1] + s * a + c * b) for a, b in
               ((hl, hw), (hl, -hw), (-hl, -hw), (-hl, hw))]
    cv2.fillPoly(img, [px(corners)], colour)
