"""The runtime's study switches in one ``hn.StudyOptions`` (hetero_nn/scheduler/study.py),
the old keywords still accepted and overriding it."""

import pytest

import hetero_nn as hn
from hetero_nn.scheduler.engine.replay import unavailable


def test_the_defaults_are_the_runtime_s_own():
    with hn.Runtime(devices="cpu:2", trace=False, perfmodel=False) as rt:
        assert rt.study == hn.StudyOptions()
        assert rt.overlap and rt.arenas and rt.fuse_chains and rt.replay_engine == "compiled"


def test_study_options_switch_the_runtime_s_machinery_off():
    study = hn.StudyOptions(overlap=False, arenas=False, replay_engine="executor",
                            fuse_chains=False)
    with hn.Runtime(devices="cpu:2", trace=False, perfmodel=False, study=study) as rt:
        assert not rt.overlap and not rt.arenas and not rt.fuse_chains
        assert rt.replay_engine == "executor"
        assert "replay_engine='executor'" in unavailable(rt)


def test_the_old_keywords_still_work_and_override_the_options():
    with hn.Runtime(devices="cpu:2", trace=False, perfmodel=False, overlap=False) as rt:
        assert not rt.overlap and rt.arenas and rt.study.overlap is False
    with hn.Runtime(devices="cpu:2", trace=False, perfmodel=False, arenas=True,
                    study=hn.StudyOptions(arenas=False, overlap=False)) as rt:
        assert rt.arenas and not rt.overlap


def test_a_bad_replay_engine_is_one_clear_error():
    with pytest.raises(hn.ConfigError, match="replay_engine='jit'"):
        hn.StudyOptions(replay_engine="jit")
    with pytest.raises(hn.ConfigError, match="replay_engine='jit'"):
        hn.Runtime(devices="cpu:1", replay_engine="jit")
