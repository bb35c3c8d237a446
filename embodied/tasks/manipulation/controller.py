"""LIBERO's action space on joint position servos: a 7-dim end-effector delta pose plus gripper command, turned into
joint targets for every world at once by damped least squares on the batched site Jacobians (no per-env Python loop).
The arm's joints are hinges on the chain from the world to the hand, so the site's Jacobian column of joint ``j`` is
``[a_j x (p - o_j); a_j]`` from the joint's world axis ``a_j`` and anchor ``o_j``, which MuJoCo's position stage
leaves in ``xaxis`` / ``xanchor`` for every world (what ``mj_jac`` returns, to round-off; a test checks it against
``mujoco.batch``'s ``jac``, which reruns the kinematics of each world and cost a third of the controller).

Action ``[dx, dy, dz, droll, dpitch, dyaw, gripper]`` in [-1, 1]: the first three scaled by ``max_translation``
[m] and the next three by ``max_rotation`` [rad] form the commanded change of the end-effector pose over one
control step, in the world frame (the rotation as an axis-angle vector); ``gripper``: its sign opens (<= 0) or
closes (> 0) the fingers (LIBERO's sign; robosuite's gripper reads only the sign too, so a policy's gripper output
is a decision, and a half-way value is no half-closed hand). The arm's joint targets are
``q + J^T (J J^T + lambda^2 I)^-1 [dp; dw]``, clipped to the joint ranges."""

from __future__ import annotations

import mujoco
import numpy as np
import torch

from embodied.tasks.manipulation.scene import ARM_JOINTS, EE_SITE, FINGER_JOINTS, FINGER_OPEN


def rotation_error(target: torch.Tensor, current: torch.Tensor) -> torch.Tensor:
    """Axis-angle vectors ``[N, 3]`` of ``target @ current^T`` (rotation matrices ``[N, 3, 3]``): the world-frame
    rotation that takes ``current`` to ``target``."""
    r = target @ current.transpose(1, 2)
    cos = ((r.diagonal(dim1=1, dim2=2).sum(1) - 1) / 2).clamp(-1.0, 1.0)
    angle = torch.acos(cos)
    axis = torch.stack([r[:, 2, 1] - r[:, 1, 2], r[:, 0, 2] - r[:, 2, 0], r[:, 1, 0] - r[:, 0, 1]], 1)
    sin = torch.sin(angle)
    # angle / (2 sin angle) -> 1/2 as angle -> 0; near pi the axis is ill-conditioned, as for every log map
    scale = torch.where(sin.abs() > 1e-6, angle / (2 * sin), torch.full_like(angle, 0.5))
    return axis * scale[:, None]


def axis_angle_matrix(v: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``[N, 3, 3]`` of axis-angle vectors ``[N, 3]`` (Rodrigues)."""
    angle = v.norm(dim=1, keepdim=True)
    k = v / angle.clamp_min(1e-12)
    kx = torch.zeros(v.shape[0], 3, 3, dtype=v.dtype, device=v.device)
    kx[:, 0, 1], kx[:, 0, 2], kx[:, 1, 2] = -k[:, 2], k[:, 1], -k[:, 0]
    kx = kx - kx.transpose(1, 2)
    s, c = torch.sin(angle)[:, :, None], torch.cos(angle)[:, :, None]
    eye = torch.eye(3, dtype=v.dtype, device=v.device).expand_as(kx)
    return eye + s * kx + (1 - c) * (kx @ kx)


class DeltaPoseController:
    def __init__(self, sim, max_translation: float = 0.03, max_rotation: float = 0.3, damping: float = 0.05):
        m = sim.model
        self.sim, self.max_translation, self.max_rotation = sim, max_translation, max_rotation
        self.damping = damping
        self.site = m.site(EE_SITE).id
        self.site_body = int(m.site_bodyid[self.site])
        arm = [m.joint(j) for j in ARM_JOINTS]
        self.arm_qpos = torch.tensor([int(j.qposadr[0]) for j in arm])
        self.arm_dof = torch.tensor([int(j.dofadr[0]) for j in arm])
        self.q_low = torch.tensor([j.range[0] for j in arm], dtype=torch.float64)
        self.q_high = torch.tensor([j.range[1] for j in arm], dtype=torch.float64)
        act_joint = m.actuator_trnid[:, 0]
        self.arm_act = torch.tensor([int(np.flatnonzero(act_joint == j.id)[0]) for j in arm])
        self.finger_act = torch.tensor([int(np.flatnonzero(act_joint == m.joint(f).id)[0]) for f in FINGER_JOINTS])
        self.site_xpos, self.site_xmat = sim.t("site_xpos"), sim.t("site_xmat")
        chain, b = set(), self.site_body
        while b > 0:
            chain.add(b)
            b = int(m.body_parentid[b])
        if any(int(j.type[0]) != mujoco.mjtJoint.mjJNT_HINGE or int(j.bodyid[0]) not in chain for j in arm):
            raise ValueError("the controller's Jacobian needs the arm's joints to be hinges on the hand's chain")
        self.arm_joint = torch.tensor([int(j.id) for j in arm])
        self.xaxis, self.xanchor = sim.t("xaxis"), sim.t("xanchor")

    def ee_pose(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ``[N, 3]`` and rotation matrix ``[N, 3, 3]`` of the end-effector site (as of the last
        position stage: a ``forward``, or a step with ``positions=True``)."""
        return self.site_xpos[:, self.site].clone(), self.site_xmat[:, self.site].reshape(-1, 3, 3).clone()

    def arm_jacobian(self) -> torch.Tensor:
        """The end-effector site's Jacobian ``[N, 6, 7]`` (translation rows, then rotation) in the arm's joints, at
        the state of the last position stage."""
        axis = self.xaxis[:, self.arm_joint]  # [N, 7, 3]
        lever = self.site_xpos[:, self.site, None] - self.xanchor[:, self.arm_joint]
        return torch.cat([torch.linalg.cross(axis, lever), axis], 2).transpose(1, 2)

    def joint_targets(self, dp: torch.Tensor, dw: torch.Tensor) -> torch.Tensor:
        """Arm joint targets ``[N, 7]`` that move the end effector by ``dp`` [m] and rotate it by ``dw`` [rad]
        (world frame, ``[N, 3]`` each), from the current state."""
        jac = self.arm_jacobian()
        err = torch.cat([dp, dw], 1).to(torch.float64)[:, :, None]
        eye = torch.eye(6, dtype=torch.float64)
        dq = jac.transpose(1, 2) @ torch.linalg.solve(jac @ jac.transpose(1, 2) + self.damping ** 2 * eye, err)
        q = self.sim.qpos[:, self.arm_qpos]
        return torch.minimum(torch.maximum(q + dq[:, :, 0], self.q_low), self.q_high)

    def controls(self, action: torch.Tensor) -> torch.Tensor:
        """``ctrl [N, nu]`` for a batch of LIBERO actions ``[N, 7]`` in [-1, 1]."""
        a = action.to(torch.float64).clamp(-1.0, 1.0)
        ctrl = torch.zeros(a.shape[0], self.sim.model.nu, dtype=torch.float64)
        ctrl[:, self.arm_act] = self.joint_targets(a[:, :3] * self.max_translation, a[:, 3:6] * self.max_rotation)
        closed = (a[:, 6:7] > 0).to(torch.float64)  # the command's sign, as robosuite's gripper reads it
        ctrl[:, self.finger_act] = (FINGER_OPEN * (1 - closed)).expand(-1, self.finger_act.numel())
        return ctrl
