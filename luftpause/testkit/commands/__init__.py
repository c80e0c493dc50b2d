"""The test kit's user commands: ``luftpause fake-engine`` (:mod:`.fake_engine`, over
:mod:`luftpause.testkit.engine`) and ``luftpause loadgen`` (:mod:`.loadgen`, over
:mod:`luftpause.testkit.load`). Each exposes ``add_arguments(parser)`` and ``run(args) -> int``.
"""
