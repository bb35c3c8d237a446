"""The splat compositing kernel (numba) against the plain-torch reference, and both against analytic values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embodied.kernels.splat_numba import composite as composite_numba
from embodied.sim_backends.splat.raster_reference import composite as composite_reference
from embodied.sim_backends.splat.reference import covariance3d, look_at, project, sh_to_rgb


def projected(n: int, seed: int, width: int = 112, height: int = 64):
    g = torch.Generator().manual_seed(seed)
    means = torch.rand(n, 3, generator=g) * torch.tensor([4.0, 3.0, 2.0]) + torch.tensor([3.0, -1.5, -1.0])
    log_scales = torch.randn(n, 3, generator=g) * 0.5 - 2.5
    quats = torch.randn(n, 4, generator=g)
    opacity = torch.sigmoid(torch.randn(n, generator=g) * 1.5)
    sh = torch.randn(n, 4, 3, generator=g) * 0.5
    view = look_at((0.0, 0.0, 0.0), (1.0, 0.0, 0.0))
    f = 0.5 * width / math.tan(math.radians(45))
    p = project(means, covariance3d(log_scales, quats), view, f, f, width / 2, height / 2, width, height)
    rgb = sh_to_rgb(sh, means, torch.zeros(3))
    return (p["means2d"], p["conic"], opacity, rgb, p["depth"], p["radius"], p["valid"]), width, height


@pytest.mark.parametrize("n,seed", [(1, 0), (40, 1), (400, 2), (2000, 3)])
def test_kernel_matches_the_reference(n, seed):
    args, w, h = projected(n, seed)
    ref = composite_reference(*args, w, h, bg=(0.1, 0.2, 0.3))
    out = composite_numba(*args, w, h, bg=(0.1, 0.2, 0.3))
    for name, a, b in zip(("rgb", "depth", "alpha"), out, ref):
        err = (a.double() - b).abs()
        assert err.max() < 2e-4, (name, float(err.max()))
        assert (err > 1e-5).double().mean() < 0.01, name  # float32 vs float64: rare last-digit differences
    assert ref[2].max() > 0.5  # something was drawn


def test_single_gaussian_exact():
    w, h = 32, 32
    o, sigma_px = 0.8, 2.0
    a = 1.0 / (sigma_px ** 2)  # conic of an isotropic screen-space Gaussian
    args = (torch.tensor([[16.5, 10.5]]), torch.tensor([[a, 0.0, a]]), torch.tensor([o]),
            torch.tensor([[1.0, 0.5, 0.25]]), torch.tensor([3.0]), torch.tensor([[6.0, 6.0]]), torch.tensor([True]))
    for composite in (composite_reference, composite_numba):
        rgb, depth, alpha = composite(*args, w, h)
        assert float(alpha[10, 16]) == pytest.approx(o, rel=1e-6)  # the pixel centred on the mean
        assert rgb[10, 16].tolist() == pytest.approx([o, 0.5 * o, 0.25 * o], rel=1e-6)
        assert float(depth[10, 16]) == pytest.approx(3.0 * o, rel=1e-6)
        assert float(alpha[10, 17]) == pytest.approx(o * math.exp(-0.5 * a), rel=1e-6)  # one pixel right
        # 3 sigma out (pixel 22.5, on the edge of the 6 px box) it is drawn; outside the box (dx = 7) it is not
        assert float(alpha[10, 22]) == pytest.approx(o * math.exp(-0.5 * a * 36), rel=1e-5)
        assert float(alpha[10, 23]) == 0.0 and float(alpha[3, 16]) == 0.0


def test_opaque_front_gaussian_stops_the_pixel():
    """At one pixel: an opaque Gaussian (alpha 0.99), a half-transparent one behind it (drawn through the 1% left),
    and an opaque third that would take T below 1e-4: it stops the pixel and is not drawn."""
    w = h = 16
    big = 1e-6
    args = (torch.tensor([[8.5, 8.5]] * 3), torch.tensor([[big, 0.0, big]] * 3), torch.tensor([1.0, 0.5, 1.0]),
            torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), torch.tensor([1.0, 2.0, 3.0]),
            torch.tensor([[5.0, 5.0]] * 3), torch.tensor([True, True, True]))
    for composite in (composite_reference, composite_numba):
        rgb, _, alpha = composite(*args, w, h)
        np.testing.assert_allclose(rgb[8, 8].double().numpy(), [0.99, 0.005, 0.0], rtol=1e-5, atol=1e-7)
        assert float(alpha[8, 8]) == pytest.approx(1 - 0.005, rel=1e-6)


def test_radix_argsort_is_a_stable_argsort():
    from embodied.kernels.splat_numba import radix_argsort

    rng = np.random.default_rng(0)
    keys = np.concatenate([rng.uniform(0, 80, 5000), rng.choice([1.0, 2.5, 3e-3], 3000), [0.0, 1e30, 1e-30]])
    keys = rng.permutation(keys).astype(np.float32)
    np.testing.assert_array_equal(radix_argsort(keys), np.argsort(keys, kind="stable"))


def test_chunk_culling_keeps_everything_a_camera_can_see():
    """Rendering with the scene cut into 4 m chunks equals rendering it as one chunk (nothing visible culled)."""
    from embodied.kernels.splat_numba import chunk_scene, cov_upper, render_cameras

    g = torch.Generator().manual_seed(5)
    n = 3000
    means = (torch.rand(n, 3, generator=g) * torch.tensor([40.0, 40.0, 4.0]) - torch.tensor([20.0, 20.0, 0.0]))
    scales = torch.rand(n, 3, generator=g) * 0.3 + 0.02
    order, off, sph = chunk_scene(means.numpy(), scales.numpy())
    means, scales = means[order], scales[order]
    cov6 = cov_upper(covariance3d(scales.log(), torch.tensor([[1.0, 0.0, 0.0, 0.0]]).expand(n, 4)))
    op = torch.sigmoid(torch.randn(n, generator=g)).numpy()
    sh = (torch.rand(n, 1, 3, generator=g) - 0.5).numpy()
    views = torch.stack([look_at((0.0, 0.0, 1.5), (math.cos(a), math.sin(a), 1.4)) for a in np.linspace(0, 6, 8)])
    f = 0.5 * 56 / math.tan(math.radians(45))
    intr = np.array([[f, f, 28.0, 16.0]] * 8, np.float32)
    args = (means.numpy(), cov6, op, sh)
    one = (np.array([0, n], np.int64), np.array([[0.0, 0.0, 0.0, 1e6]], np.float32))
    culled = render_cameras(*args, off, sph, views.numpy(), intr, 56, 32, 0.01, 15.0, 0.005)
    whole = render_cameras(*args, *one, views.numpy(), intr, 56, 32, 0.01, 15.0, 0.005)
    assert len(off) > 50
    for a, b in zip(culled, whole):
        np.testing.assert_array_equal(a, b)


def test_chunk_culling_keeps_a_big_gaussian_beside_the_frustum():
    """A 0.5 m Gaussian 2 m ahead and 4.4 m right of a 90-degree, 56 px camera: its centre is outside the frustum,
    but its EWA box (Jacobian clamped at 1.3 tan(fov/2)) reaches the right image edge; culling must keep it."""
    from embodied.kernels.splat_numba import chunk_scene, cov_upper, render_cameras

    means = np.array([[2.0, -4.4, 1.5]], np.float32)
    scales = np.full((1, 3), 0.5, np.float32)
    order, off, sph = chunk_scene(means, scales)
    cov6 = cov_upper(covariance3d(torch.from_numpy(scales).log(), torch.tensor([[1.0, 0.0, 0.0, 0.0]])))
    args = (means, cov6, np.array([0.9], np.float32), np.full((1, 1, 3), 0.5, np.float32))
    view = look_at((0.0, 0.0, 1.5), (1.0, 0.0, 1.5)).numpy()[None]
    intr = np.array([[28.0, 28.0, 28.0, 16.0]], np.float32)
    culled = render_cameras(*args, off, sph, view, intr, 56, 32, 0.01, 50.0, 0.005)
    whole = render_cameras(*args, np.array([0, 1], np.int64), np.array([[0, 0, 0, 1e6]], np.float32), view, intr,
                           56, 32, 0.01, 50.0, 0.005)
    assert float(whole[2][0, :, 55].max()) > 1.0 / 255  # drawn at the right edge
    for a, b in zip(culled, whole):
        np.testing.assert_array_equal(a, b)
