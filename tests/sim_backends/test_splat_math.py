"""Splat scenes and math: the INRIA .ply round trip (SH degrees 0-3, properties by name, bad files), the SH basis
(exact values and orthonormality, which pins every constant), covariances, and the EWA projection (exact values
for a Gaussian on the optical axis, culling)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embodied.core.errors import UserError
from embodied.sim_backends.splat.reference import (
    C0,
    C1,
    EPS2D,
    covariance3d,
    look_at,
    project,
    sh_basis,
    sh_to_rgb,
)
from embodied.sim_backends.splat.scene import GaussianScene, read_ply, write_ply


def random_scene(n: int, degree: int, seed: int = 0) -> GaussianScene:
    rng = np.random.default_rng(seed)
    k = (degree + 1) ** 2
    return GaussianScene(rng.normal(size=(n, 3)).astype(np.float32), rng.normal(-3, 1, (n, 3)).astype(np.float32),
                         rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=n).astype(np.float32),
                         rng.normal(size=(n, k, 3)).astype(np.float32))


@pytest.mark.parametrize("degree", [0, 1, 2, 3])
def test_ply_round_trip_is_exact(tmp_path, degree):
    scene = random_scene(50, degree)
    back = read_ply(write_ply(scene, tmp_path / "s.ply"))
    assert back.sh_degree == degree
    for name in ("means", "log_scales", "quats", "opacity_logits", "sh"):
        np.testing.assert_array_equal(getattr(back, name), getattr(scene, name))


def test_ply_reads_by_property_name(tmp_path):
    """Shuffled properties, doubles, extra uchar colours (other exporters): read by name, values kept."""
    from plyfile import PlyData, PlyElement

    scene = random_scene(20, 1)
    ref = read_ply(write_ply(scene, tmp_path / "a.ply"))
    src = PlyData.read(str(tmp_path / "a.ply"))["vertex"].data
    names = list(src.dtype.names)
    rng = np.random.default_rng(1)
    rng.shuffle(names)
    data = np.empty(len(src), dtype=[(n, "f8") for n in names] + [("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for n in names:
        data[n] = src[n]
    PlyData([PlyElement.describe(data, "vertex")], text=True).write(str(tmp_path / "b.ply"))  # ascii too
    back = read_ply(tmp_path / "b.ply")
    for name in ("means", "log_scales", "quats", "opacity_logits", "sh"):
        np.testing.assert_allclose(getattr(back, name), getattr(ref, name), rtol=1e-6, atol=1e-7)


def test_bad_ply_is_one_user_error(tmp_path):
    from plyfile import PlyData, PlyElement

    data = np.zeros(3, dtype=[("x", "f4"), ("y", "f4"), ("z", "f4")])
    PlyData([PlyElement.describe(data, "vertex")]).write(str(tmp_path / "points.ply"))
    with pytest.raises(UserError, match="lacks the Gaussian-splat properties f_dc_0"):
        read_ply(tmp_path / "points.ply")
    (tmp_path / "junk.ply").write_bytes(b"not a ply at all")
    with pytest.raises(UserError, match="not a readable .ply"):
        read_ply(tmp_path / "junk.ply")
    with pytest.raises(UserError, match="not found"):
        read_ply(tmp_path / "missing.ply")


def fibonacci_sphere(n: int) -> torch.Tensor:
    i = torch.arange(n, dtype=torch.float64) + 0.5
    z = 1 - 2 * i / n
    phi = math.pi * (1 + 5 ** 0.5) * i
    r = torch.sqrt(1 - z * z)
    return torch.stack([r * torch.cos(phi), r * torch.sin(phi), z], -1)


def test_sh_basis_is_orthonormal_and_exact():
    d = fibonacci_sphere(200_000)
    y = sh_basis(d, 3)
    gram = (y.T @ y) * (4 * math.pi / d.shape[0])  # integral over the sphere
    torch.testing.assert_close(gram, torch.eye(16, dtype=torch.float64), atol=2e-4, rtol=0)
    up = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    b = sh_basis(up, 3)[0]
    assert b[0] == C0 and b[2] == C1 and b[1] == 0 and b[3] == 0  # degree 1 at +z: only the z term
    assert b[6] == pytest.approx(0.31539156525252005 * 2)  # C2[2] (2zz - xx - yy)
    assert b[12] == pytest.approx(0.3731763325901154 * 2)  # C3[3] z (2zz - 3xx - 3yy)


def test_sh_colour_degree_zero_and_clamp():
    rgb = torch.tensor([[0.2, 0.5, 0.9]])
    sh = ((rgb - 0.5) / C0)[:, None, :]
    out = sh_to_rgb(sh, torch.tensor([[0.0, 0.0, 5.0]]), torch.zeros(3))
    torch.testing.assert_close(out, rgb)
    assert sh_to_rgb(torch.full((1, 1, 3), -10.0), torch.ones(1, 3), torch.zeros(3)).eq(0).all()  # max(0, .)


def test_covariance3d():
    s = torch.tensor([[math.log(0.1), math.log(0.2), math.log(0.3)]])
    cov = covariance3d(s, torch.tensor([[2.0, 0.0, 0.0, 0.0]]))  # unnormalized identity
    torch.testing.assert_close(cov[0], torch.diag(torch.tensor([0.01, 0.04, 0.09])))
    q90 = torch.tensor([[math.cos(math.pi / 4), 0.0, 0.0, math.sin(math.pi / 4)]])  # 90 deg about z: x <-> y
    torch.testing.assert_close(covariance3d(s, q90)[0], torch.diag(torch.tensor([0.04, 0.01, 0.09])), atol=1e-7,
                               rtol=0)


def test_projection_exact_on_the_optical_axis_and_culling():
    fx, fy, w, h = 100.0, 120.0, 112, 64
    cx, cy = w / 2, h / 2
    sigma, z = 0.05, 4.0
    means = torch.tensor([[0.0, 0.0, z], [0.0, 0.0, -1.0], [100.0, 0.0, 2.0]])
    cov = (sigma ** 2) * torch.eye(3).expand(3, 3, 3)
    out = project(means, cov, torch.eye(4), fx, fy, cx, cy, w, h)
    a, c = fx ** 2 * sigma ** 2 / z ** 2 + EPS2D, fy ** 2 * sigma ** 2 / z ** 2 + EPS2D
    torch.testing.assert_close(out["means2d"][0], torch.tensor([cx, cy]))
    torch.testing.assert_close(out["conic"][0], torch.tensor([1 / a, 0.0, 1 / c]))
    assert out["radius"][0].tolist() == pytest.approx([3 * math.sqrt(a), 3 * math.sqrt(c)], rel=1e-6)
    assert out["depth"][0] == z
    assert out["valid"].tolist() == [True, False, False]  # behind the camera; far off screen


def test_look_at_and_offset_projection():
    view = look_at((0.0, 0.0, 0.0), (10.0, 0.0, 0.0))  # looking down +x, z up
    pts = torch.tensor([[10.0, 0.0, 0.0], [10.0, -1.0, 0.5]])  # ahead; right (y -> -1) and up
    out = project(pts, 1e-4 * torch.eye(3).expand(2, 3, 3), view, 100.0, 100.0, 50.0, 50.0, 100, 100)
    torch.testing.assert_close(out["means2d"][0], torch.tensor([50.0, 50.0]))
    u, v = out["means2d"][1].tolist()
    assert u == pytest.approx(60.0, abs=1e-4) and v == pytest.approx(45.0, abs=1e-4)  # right: +u, up: -v
    assert out["depth"].tolist() == pytest.approx([10.0, 10.0])


def test_render_both_kernels_agree_and_the_image_moves_with_the_camera(tmp_path):
    from embodied.sim_backends.splat.reference import fov_to_focal
    from embodied.sim_backends.splat.render import Camera, SplatScene, render

    rng = np.random.default_rng(0)
    n = 300
    means = np.stack([rng.uniform(4, 8, n), rng.uniform(-2, 2, n), rng.uniform(-1, 1, n)], 1)
    scene = GaussianScene.from_rgb(means, np.full((n, 3), 0.08), rng.uniform(0, 1, (n, 3)), rng.uniform(0.3, 0.9, n))
    scene = read_ply(write_ply(scene, tmp_path / "s.ply"))  # what a scene file gives
    s = SplatScene(scene)
    f = fov_to_focal(math.radians(90), 112)

    def cam(y):
        return Camera(look_at((0.0, y, 0.0), (1.0, y, 0.0)), f, f, 56.0, 32.0, 112, 64)

    a = render(s, [cam(0.0), cam(0.3)], bg=(0.2, 0.2, 0.2))
    b = render(s, [cam(0.0), cam(0.3)], bg=(0.2, 0.2, 0.2), kernel="torch")
    assert a["rgb"].shape == (2, 64, 112, 3) and a["depth"].shape == (2, 64, 112)
    for k in ("rgb", "depth", "alpha"):
        assert (a[k] - b[k]).abs().max() < 2e-4, k
    assert a["alpha"].mean() > 0.03  # the scene is drawn
    # a camera moved left (+y) sees the scene shifted right in the image: the alpha centroid moves to larger u
    u = torch.arange(112, dtype=torch.float32)
    centroid = [(a["alpha"][i].sum(0) * u).sum() / a["alpha"][i].sum() for i in range(2)]
    assert centroid[1] > centroid[0] + 2
    with pytest.raises(UserError):
        render(s, [cam(0.0), Camera(cam(0.0).viewmat, f, f, 32.0, 32.0, 64, 64)])
