"""Mini-libero's relabelling (``core/relabel.py``): its four cubes differ only in colour, so an episode with the cubes'
colours renamed by a permutation (each cube's state entries moved to the entries of the colour it is now called) is an
episode of the instruction that names the renamed cubes, where the suite has one: a demonstration of putting the red
cube on the plate in the 2 x 2 grid is one of putting the green cube there (``object-green``) once red is called green;
of stacking green on blue, only under renamings that keep green and blue; a spatial task's cube is named by where it
stands, so every renaming keeps its task (and teaches that the colour does not matter). With ``surfaces`` the plate
and the tray may also swap names (their state entries exchanged): a cube put on the plate is then one put on the
tray (the tray's face is the larger, so it stays a success; a tray episode is not renamed into a plate one, whose
face may not hold it). With ``lifts`` a pick-and-place episode also holds the suite's lift: its cube, carried at 14
cm, is ``Lifted`` once its centre is 10 cm over the table, so the episode's steps before that, with the cube renamed
to the lift's, are an episode of the lift (a prefix copy). The renamed instruction is drawn from the new task's
training phrasings. State observations only (an image would have to be recoloured)."""

from __future__ import annotations

import itertools

import torch

from embodied.core.relabel import Relabeller
from embodied.tasks.manipulation.mini_libero import COLOURS, LIFT_HEIGHT, SUPPORTS

MATCH = 0.999  # an episode's instruction is the table row whose embedding it matches this well (unit vectors)


SURFACES = SUPPORTS[:2]  # plate, tray


def renamed(name: str, perm: tuple[int, ...], swap: bool = False) -> str:
    """A task's target or goal with colour ``c`` called ``COLOURS[perm[c]]`` and with ``swap`` the plate called the
    tray and the tray the plate (slots and lift unchanged)."""
    if name in COLOURS:
        return COLOURS[perm[COLOURS.index(name)]]
    return SURFACES[1 - SURFACES.index(name)] if swap and name in SURFACES else name


def first_rows(episode: torch.Tensor, where: torch.Tensor | None = None) -> torch.Tensor:
    """``[n]``: each episode's first row (``episode [T]`` numbered 0..n-1), or with ``where [T]`` its first row where
    that holds (``T`` where none does)."""
    n = int(episode.max()) + 1 if len(episode) else 0
    t = torch.arange(len(episode), device=episode.device)
    if where is not None:
        t = torch.where(where, t, len(episode))
    return torch.full((n,), len(episode), dtype=torch.long, device=episode.device).scatter_reduce(0, episode, t,
                                                                                                    "amin")


def episode_tasks(obs: torch.Tensor, episode: torch.Tensor, text: slice, table: torch.Tensor,
                  row_task: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each episode's first row ``[n]`` and its task ``[n]`` (the suite's index; -1 where its instruction embedding
    matches no row of ``table`` within ``MATCH``; ``row_task`` maps a table row to its task)."""
    first = first_rows(episode)
    best, row = (obs[first, text] @ table.to(obs.device).T).max(1)
    return first, torch.where(best > MATCH, row_task.to(obs.device)[row], -1)


def task_rows(suite, index: dict[str, int], size: int) -> torch.Tensor:
    """``[size]``: the task of each row of the instruction table (its phrasings' and paraphrases' rows; -1 else)."""
    row_task = torch.full((size,), -1, dtype=torch.long)
    for i, t in enumerate(suite):
        for s in (*t.phrasings, *t.paraphrases):
            row_task[index[s]] = i
    return row_task


def phrasing_rows(suite, index: dict[str, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per task its training phrasings' count ``[n]`` and their table rows ``[n, w]`` (padded with its first)."""
    phr = [[index[s] for s in t.phrasings] for t in suite]
    return torch.tensor([len(p) for p in phr]), torch.tensor([[*p, *[p[0]] * (max(map(len, phr)) - len(p))]
                                                              for p in phr])


def _table(pairs: list[list[tuple[int, int]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per task a list of (renaming, new task) pairs as their counts ``[n]`` and a padded table ``[n, w, 2]``."""
    width = max(1, max(map(len, pairs)))
    return (torch.tensor([len(p) for p in pairs]),
            torch.tensor([[*p, *[(0, 0)] * (width - len(p))] for p in pairs], dtype=torch.long))


class ColourRenaming(Relabeller):
    """``suite``: the env's tasks (``MiniTask``); ``table [K, 384]`` the instruction embeddings and ``index`` each
    instruction string's row; the policy observation's cubes at ``cubes`` (``[start, entries per cube]``, colour
    order) and its instruction embedding at ``text`` (its start); with ``surfaces`` (``[plate start, tray start,
    entries each]``) the plate and the tray may swap names too; with ``lifts`` > 0 that share of the copies of an
    episode whose task moves a cube named by its colour are prefix copies of the lift (drawn from its renamings
    that call that cube the lift's; the cube's height: entry 2 of its block)."""

    def __init__(self, suite, table: torch.Tensor, index: dict[str, int], cubes: tuple[int, int], text: int,
                 surfaces: tuple[int, int, int] | None = None, lifts: float = 0.0):
        self.table = table
        self.cube_start, self.cube_size = cubes
        self.text = slice(text, text + table.shape[1])
        self.surfaces = surfaces
        colour_perms = list(itertools.permutations(range(len(COLOURS))))  # 0: the identity
        # the renamings: a permutation of the colours, and whether the plate and the tray swap names
        self.perms = torch.tensor(colour_perms * (2 if surfaces else 1))  # [24 or 48, 4]
        self.swaps = torch.arange(len(self.perms)) >= len(colour_perms)
        self.row_task = task_rows(suite, index, len(table))
        # per task, every (renaming, new task) pair whose episode it can become, itself unrenamed left out
        pairs = [[(g, j) for g, (p, w) in enumerate(zip(self.perms.tolist(), self.swaps.tolist()))
                  for j, u in enumerate(suite)
                  if (g, j) != (0, i) and u.layout == t.layout and u.target == renamed(t.target, p, w)
                  and u.goal == renamed(t.goal, p, w) and not (w and t.goal == "tray")] for i, t in enumerate(suite)]
        self.count, self.pairs = _table(pairs)  # [n], [n, w, 2]
        # per task, the (colour renaming, lift) pairs whose renaming calls its cube the lift's: its prefix copies
        self.lifts = lifts
        self.lift_count, self.lift_pairs = _table(
            [[(g, j) for g, p in enumerate(colour_perms) for j, u in enumerate(suite)
              if u.goal == "lift" != t.goal and u.layout == t.layout and t.target in COLOURS
              and u.target == renamed(t.target, p)] for t in suite])
        self.lifted = torch.tensor([COLOURS.index(t.target) if t.goal == "lift" else -1 for t in suite])
        self.phrase_count, self.phrase_rows = phrasing_rows(suite, index)

    def relabel(self, obs: torch.Tensor, episode: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, None]:
        dev = obs.device
        n = int(episode.max()) + 1 if len(episode) else 0
        t = torch.arange(len(episode), device=dev)
        first, task = episode_tasks(obs, episode, self.text, self.table, self.row_task)
        count = torch.where(task >= 0, self.count.to(dev)[task.clamp_min(0)], 0)
        has = count > 0
        k = (torch.rand(n, generator=generator, device=generator.device).to(dev) * count).long()
        pair = self.pairs.to(dev)[task.clamp_min(0), k.clamp_max(self.pairs.shape[1] - 1)]  # [n, 2]
        cut = torch.zeros(n, dtype=torch.bool, device=dev)
        if self.lifts:  # a prefix copy of the lift instead, with that chance, where the episode's task has one
            lift_count = torch.where(task >= 0, self.lift_count.to(dev)[task.clamp_min(0)], 0)
            u = torch.rand(n, 2, generator=generator, device=generator.device).to(dev)
            cut = (u[:, 0] < self.lifts) & (lift_count > 0)
            lift = self.lift_pairs.to(dev)[task.clamp_min(0), (u[:, 1] * lift_count).long().clamp_max(
                self.lift_pairs.shape[1] - 1)]
            pair = torch.where(cut[:, None], lift, pair)
            has = has | cut
        perm, new = pair[:, 0], pair[:, 1]
        v = torch.rand(n, generator=generator, device=generator.device).to(dev)
        phrase = self.phrase_rows.to(dev)[new, (v * self.phrase_count.to(dev)[new]).long()]
        # the entries of the cube now called colour d are those of colour c with perm[c] = d
        source = torch.where(has[:, None], self.perms.to(dev)[perm].argsort(1),
                             torch.arange(len(COLOURS), device=dev))  # [n, 4]
        a, w = self.cube_start, self.cube_size
        index = torch.arange(obs.shape[1], device=dev).repeat(n, 1)
        index[:, a:a + len(COLOURS) * w] = (a + w * source[:, :, None] + torch.arange(w, device=dev)).flatten(1)
        if self.surfaces:  # the plate's entries and the tray's exchanged where the renaming swaps them
            plate, tray, size = self.surfaces
            swap = (has & self.swaps.to(dev)[perm])[:, None]
            ps, ts = torch.arange(plate, plate + size, device=dev), torch.arange(tray, tray + size, device=dev)
            index[:, plate:plate + size] = torch.where(swap, ts, ps)
            index[:, tray:tray + size] = torch.where(swap, ps, ts)
        out = obs.gather(1, index[episode])
        text = torch.where(has[:, None], self.table.to(dev)[phrase], obs[first, self.text])
        out[:, self.text] = text[episode]
        keep = has[episode]
        if bool(cut.any()):  # a prefix copy keeps the steps before the renamed cube is first lifted (none if never)
            height = out.gather(1, (a + w * self.lifted.to(dev)[new].clamp_min(0) + 2)[episode, None]).squeeze(1)
            up = first_rows(episode, height > LIFT_HEIGHT)
            keep &= ~cut[episode] | ((t < up[episode]) & (up < len(episode))[episode])
        return out, keep, None


def mirrored(task, suite) -> int:
    """The suite's index of ``task`` seen in a mirror across the robot's x-z plane (y -> -y), -1 where the suite has
    none: a row's slot k is its slot 3 - k (the rightmost cube is then the leftmost); a column's slots, colours,
    supports and the lift are what they were."""
    target = task.target
    if task.layout == "row" and target.startswith("slot"):
        target = f"slot{3 - int(target[4:])}"
    return next((j for j, u in enumerate(suite) if (u.group, u.layout, u.colours, u.target, u.goal) ==
                 (task.group, task.layout, task.colours, target, task.goal)), -1)


class Mirror(Relabeller):
    """Mini-libero seen in a mirror across the robot's x-z plane: the arm, the table and the cubes are symmetric under
    y -> -y, so an episode with every y negated, the gripper's rotation mirrored and turned a quarter about its own
    axis (the home pose's mirror image is the home pose turned 90 degrees; the hand grips the 4-fold cube alike
    either way), every cube's yaw negated, is an episode of the mirrored layout, with its world-frame motions
    mirrored: dy and the rotation's x and z negated (an axial vector under a reflection). A row's leftmost cube is
    then its rightmost, so a row episode is one of the other end's task; the plate and the tray keep their names
    where they now stand. Checked by replaying recorded expert episodes' mirrored actions from their mirrored states
    (issue 13, stop 76): the replay follows the copy to a few mm until the fingers touch the cube (the model is
    mirror-symmetric to 0.2 mm), clean grasps then succeed as the copies say (2 of 2), and episodes with a regrasp
    diverge and fail (3 of 4; with the exact mirror, the hand not turned, as often): the copies are approximate
    where contact is chaotic, as the shifted ones are. ``share``: the chance an episode's copy is mirrored (a task
    with no mirror image in the suite has none); ``obs_index`` / ``obs_sign`` the policy observation's signed
    permutation (``x'[j] = sign[j] * x[index[j]]``, the instruction's entries left to the new instruction),
    ``action_sign`` the action's."""

    def __init__(self, suite, table: torch.Tensor, index: dict[str, int], text: int, obs_index: list[int],
                 obs_sign: list[float], action_sign: list[float], share: float):
        self.table, self.share = table, float(share)
        self.text = slice(text, text + table.shape[1])
        self.row_task = task_rows(suite, index, len(table))
        self.image = torch.tensor([mirrored(t, suite) for t in suite])  # each task's mirror image, -1: none
        self.phrase_count, self.phrase_rows = phrasing_rows(suite, index)
        self.obs_index, self.obs_sign = torch.tensor(obs_index), torch.tensor(obs_sign)
        self.action_sign = torch.tensor(action_sign)

    def relabel(self, obs: torch.Tensor, episode: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        dev = obs.device
        n = int(episode.max()) + 1 if len(episode) else 0
        first, task = episode_tasks(obs, episode, self.text, self.table, self.row_task)
        new = torch.where(task >= 0, self.image.to(dev)[task.clamp_min(0)], -1)
        u = torch.rand(n, 2, generator=generator, device=generator.device).to(dev)
        has = (u[:, 0] < self.share) & (new >= 0)
        new = new.clamp_min(0)
        phrase = self.phrase_rows.to(dev)[new, (u[:, 1] * self.phrase_count.to(dev)[new]).long()]
        flip = has[episode]
        out = torch.where(flip[:, None], obs[:, self.obs_index.to(dev)] * self.obs_sign.to(dev, obs.dtype), obs)
        out[:, self.text] = torch.where(has[:, None], self.table.to(dev, obs.dtype)[phrase],
                                        obs[first, self.text])[episode]
        sign = torch.where(flip[:, None], self.action_sign.to(dev), torch.ones_like(self.action_sign).to(dev))
        return out, flip, sign


class ReachJitter(Relabeller):
    """The reach of an episode with everything but the cube it moves jittered in the plane: until the moved cube
    (the one lifted highest) first rises ``RISE`` above where it stood, the arm's motion depends on that cube alone,
    so the episode's steps before then, with the other cubes each moved by its own offset (uniform +-``cube`` [m] per
    axis) and the plate and the tray each by theirs (+-``surface``), are a reach to the same cube in another layout
    (a prefix copy). One demonstration a task holds its cube and its goal at one relative placement, and every
    renamed or shifted copy keeps it, so a clone can read where to reach off the goal's position as well as the
    cube's; these copies tell the two apart. ``share``: the chance an episode's copy is one; ``cubes`` / ``surfaces``:
    ``[start, entries each]`` of the cube blocks (colour order; x, y at 0, 1 and 3, 4 (from the grip point) and 8, 9
    (where it stood); z at 2) and ``[plate start, tray start, entries each]`` (x, y at 0, 1 and 3, 4)."""

    RISE = 0.01  # [m]

    def __init__(self, cubes: tuple[int, int], surfaces: tuple[int, int, int], cube: float, surface: float,
                 share: float):
        a, w = cubes
        plate, tray, _ = surfaces
        # the x entries (y: the next) of the four cubes, then of the plate and the tray, and each one's entity
        xs = [[a + w * c, a + w * c + 3, a + w * c + 8] for c in range(len(COLOURS))] + [[s, s + 3] for s in
                                                                                         (plate, tray)]
        self.x = torch.tensor([i for e in xs for i in e])
        self.entity = torch.tensor([k for k, e in enumerate(xs) for _ in e])
        self.z = torch.tensor([a + w * c + 2 for c in range(len(COLOURS))])
        self.half = torch.tensor([cube] * len(COLOURS) + [surface] * 2)
        self.share = float(share)

    def relabel(self, obs: torch.Tensor, episode: torch.Tensor,
                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, None]:
        dev = obs.device
        n = int(episode.max()) + 1 if len(episode) else 0
        t = torch.arange(len(episode), device=dev)
        first = first_rows(episode)
        z = obs[:, self.z.to(dev)]  # [T, 4]
        rise = z - z[first][episode]
        top = torch.full((n, len(COLOURS)), -1.0, dtype=obs.dtype, device=dev).scatter_reduce(
            0, episode[:, None].expand_as(rise), rise, "amax")
        moved = top.argmax(1)  # [n]
        up = first_rows(episode, rise.gather(1, moved[episode, None]).squeeze(1) > self.RISE)
        u = torch.rand(n, 1 + 2 * len(self.half), generator=generator, device=generator.device).to(dev)
        has = (u[:, 0] < self.share) & (up < len(episode))
        offset = (u[:, 1:].view(n, -1, 2) * 2 - 1) * self.half.to(dev, obs.dtype)[None, :, None]  # [n, 6, 2]
        offset[torch.arange(n, device=dev), moved] = 0.0
        offset = torch.where(has[:, None, None], offset, torch.zeros_like(offset))
        out = obs.clone()
        x, step = self.x.to(dev), offset[episode][:, self.entity.to(dev)]  # [T, entries, 2]
        out[:, x] += step[..., 0]
        out[:, x + 1] += step[..., 1]
        return out, has[episode] & (t < up[episode]), None
