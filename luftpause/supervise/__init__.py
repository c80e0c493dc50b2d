"""Process supervision: ``luftpause up`` running the stack as one (:mod:`.up`), granian workers that
end with their main process (:mod:`.orphans`), and the title a process shows in ``ps``
(:mod:`.titles`). The child processes themselves are :mod:`luftpause.testkit.launch.procs`.
"""
