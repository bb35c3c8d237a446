"""``init=RUN``'s comparison of the two policies' constructor settings."""

from embodied.train import spec_differences


def test_spec_differences_name_the_source_settings_members_included_and_skip_the_action_range():
    mine = {"width": 256, "hard_pointers": False, "low": [-1.0], "high": [1.0], "only_mine": 3}
    theirs = {"width": 256, "hard_pointers": True, "low": [-0.2], "high": [0.3], "only_theirs": 1}
    assert spec_differences(theirs, mine) == ["hard_pointers=True"]
    ens_mine = {"members": [{"name": "vla", "kwargs": mine}, {"name": "vla", "kwargs": dict(mine, width=128)}],
                "obs_dim": 5}
    ens_theirs = {"members": [{"name": "vla", "kwargs": theirs}, {"name": "vla", "kwargs": theirs}], "obs_dim": 5}
    assert spec_differences(ens_theirs, ens_mine) == ["members.0.hard_pointers=True", "members.1.hard_pointers=True",
                                                      "members.1.width=256"]
    assert spec_differences(mine, mine) == []
