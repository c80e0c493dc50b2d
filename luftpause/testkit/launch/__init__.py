"""Starting things on loopback and waiting until they answer: luftpause's processes and anything
else (:mod:`.procs`), a whole stack (:mod:`.stack`), llama.cpp's ``llama-server``
(:mod:`.llama_server`), and an aiohttp app on a thread and loop of its own (:mod:`.threaded_app`).
"""
