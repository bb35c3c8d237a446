"""Crazyflie: the unmodified cflib client over its UDP link against the software-in-the-loop CRTP vehicle:
connect (tables of contents, parameters), log blocks carrying the plant's state, MANUAL rate set-points that
arrive as the action sent, supervisor arming and e-stop, an unreachable vehicle, and fuzzed CRTP datagrams
into the vehicle's parser."""

from __future__ import annotations

import random
import socket
import struct
import time

import numpy as np
import pytest

from embodied.core.errors import UserError
from embodied.hardware import load_bundle
from embodied.hardware.loop import ControlLoop, LoopConfig
from embodied.hardware.robot import make_robot
from embodied.hardware.sitl.crazyflie import CrazyflieVehicle

FUZZ_DATAGRAMS = 10_000


def test_flight_through_cflib(rates_bundle, plant_state, lagged_error):
    runner = load_bundle(rates_bundle)
    with CrazyflieVehicle(0, seed=2) as v, make_robot(f"crazyflie://udp://127.0.0.1:{v.port}") as robot:
        seen = []

        class Spy:
            def reset(self):
                runner.reset()

            def act(self, s):
                truth = plant_state(v)
                a = runner.act(s)
                seen.append((s.copy(), truth, a.copy(), v.setpoint.copy()))
                return a

        summary = ControlLoop(robot, Spy(), LoopConfig(100.0, duration_s=1.0, status=False)).run()
        deadline = time.monotonic() + 1
        while v.armed and time.monotonic() < deadline:  # the disarm request is a datagram in flight
            time.sleep(0.01)
        assert v.counts["manual"] >= 90 and not v.armed  # disarmed at the end
    assert summary["outcome"] == "completed" and summary["ticks"] >= 90
    # the log blocks carry the plant's state: each reading is one of the plant's recent states (telemetry lags
    # a period or more on a loaded machine)
    err = lagged_error([s for s, _, _, _ in seen], [t for _, t, _, _ in seen])
    assert np.median(err[5:]) < 0.02
    # the set-point the vehicle decoded on tick k is the action of tick k - 1 (thrust percent: 16-bit steps)
    sent = np.array([a for _, _, a, _ in seen[:-1]])
    got = np.array([sp for _, _, _, sp in seen[1:]])
    close = np.abs(sent - got).max(axis=1) < 1e-3
    assert close.mean() > 0.5  # the rest arrived a tick late


def test_estop_reaches_the_vehicle(rates_bundle):
    with CrazyflieVehicle(0) as v, make_robot(f"crazyflie://udp://127.0.0.1:{v.port}") as robot:
        robot.arm()
        deadline = time.monotonic() + 2
        while not v.armed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert v.armed
        robot.estop()
        deadline = time.monotonic() + 2
        while not v.estopped and time.monotonic() < deadline:
            time.sleep(0.01)
        assert v.estopped and not v.armed


def test_unreachable_crazyflie_is_one_user_error():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, silent: cflib would wait forever
        with pytest.raises(UserError, match="cannot connect"):
            make_robot(f"crazyflie://udp://127.0.0.1:{port}?timeout=0.5").connect()
    with pytest.raises(UserError):
        make_robot("crazyflie://bluetooth://x")


def _fuzz_vehicle(n: int) -> None:
    rng = random.Random(0)
    real = [b"\xfd\x00", b"\xdd\x00", b"\x5d\x05", b"\x5c\x03", b"\x5c\x02\x00\x00", b"\x2d\x00\x00",
            b"\x2e\x00\x00\x06", b"\x5d\x06\x01\x77\x00\x00", b"\x5d\x03\x01\x01", b"\x7c" + struct.pack(
                "<BfffHB", 11, 1.0, 2.0, 3.0, 30000, 1), b"\x9d\x01\x01", b"\x3c" + struct.pack("<fffH", 0, 0, 0, 0)]
    with CrazyflieVehicle(0) as v:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(n):
            if rng.random() < 0.5:
                d = bytearray(rng.choice(real))
                for _ in range(rng.randint(1, 3)):
                    d[rng.randrange(len(d))] = rng.randrange(256)
                data = bytes(d[: rng.randint(1, len(d))])
            else:
                data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 40)))
            sock.sendto(data, ("127.0.0.1", v.port))
        sock.close()
        time.sleep(0.2)
        assert v._thread.is_alive()
        v.armed = False
        robot = make_robot(f"crazyflie://udp://127.0.0.1:{v.port}")  # a real client still connects and reads
        robot.connect()
        assert np.all(np.isfinite(robot.observe().values))
        robot.close()


def test_fuzz_crtp_vehicle_parser():
    _fuzz_vehicle(FUZZ_DATAGRAMS)


@pytest.mark.slow
def test_fuzz_crtp_vehicle_parser_100k():
    _fuzz_vehicle(100_000)


# ---- the motor-level path: the generated C as the out-of-tree controller ---------------------------------
def test_oot_app_files_and_host_build(rpm_bundle, rates_bundle, tmp_path):
    from embodied.hardware.crazyflie_app import build_host_controller, write_oot_app

    app = write_oot_app(rpm_bundle, tmp_path / "app")
    for f in ("Makefile", "Kbuild", "app-config", "src/Kbuild", "src/embodied_controller.c", "src/policy.c",
              "src/policy.h"):
        assert (app / f).is_file(), f
    assert "CONFIG_CONTROLLER_OOT=y" in (app / "app-config").read_text()
    assert "include $(CRAZYFLIE_BASE)/tools/make/oot.mk" in (app / "Makefile").read_text()
    assert build_host_controller(app, tmp_path / "b" / "liboot.so").is_file()  # -Wall -Wextra -Werror
    with pytest.raises(UserError, match="RPM-level"):
        write_oot_app(rates_bundle, tmp_path / "no")


def test_oot_controller_state_and_forces_are_the_policys(rpm_bundle):
    """The controller's state from the firmware's structs is the task's robot terms, and its motor forces are
    the bundle's action (normalized speed squared)."""
    import torch

    import embodied
    from embodied.hardware.sitl.crazyflie import OnboardController

    oot = OnboardController(rpm_bundle)
    runner = load_bundle(rpm_bundle, "c")
    env = embodied.make_env("quadrotor-hover", num_envs=1, obs_noise_position=0.0, obs_noise_orientation=0.0,
                            obs_noise_lin_vel=0.0, obs_noise_ang_vel=0.0)
    obs, _ = env.reset(seed=5)
    runner.reset()
    for tick in range(30):
        s = env.sim
        forces = oot.step(s.pos_w[0].tolist(), s.quat_wb[0].tolist(), s.lin_vel_w[0].tolist(),
                          np.degrees(s.ang_vel_b[0].numpy()).tolist(), (0.0, 0.0, 0.0), tick * 10)
        a = runner.act(obs["policy"][0, :18].numpy())
        np.testing.assert_allclose(forces, ((np.clip(a, -1, 1) + 1) / 2) ** 2, atol=2e-5)
        obs, *_ = env.step(torch.from_numpy(a)[None])


def test_motor_level_flight_through_cflib(rpm_bundle):
    with CrazyflieVehicle(0, seed=1, onboard=rpm_bundle) as v:
        robot = make_robot(f"crazyflie://udp://127.0.0.1:{v.port}")
        robot.attach_bundle(rpm_bundle)
        with robot:
            assert robot.onboard_policy and v.params[0] == 6  # cflib selected the out-of-tree controller
            summary = ControlLoop(robot, None, LoopConfig(100.0, duration_s=0.5, status=False)).run()
        assert v.counts["position"] >= 45 and v.counts["steps"] >= 45
    assert summary["outcome"] == "completed" and summary["missed_commands"] == 0


def test_a_radio_link_without_a_dongle_is_one_line(capfd):
    """cflib logged the failed link with its traceback and its exception text carries it too: one line now."""
    robot = make_robot("crazyflie://radio://0/80/2M?timeout=2")
    with pytest.raises(UserError, match="cannot connect") as e:
        robot.connect()
    assert "\n" not in str(e.value)
    assert "Traceback" not in capfd.readouterr().err
