"""One line for the frameworks' own callback systems (issue 32 §3).

A Hugging Face `Trainer` or a Lightning script gets what a script written with the
trainers library gets — heartbeats from every rank, its metrics, FLOPs counted on the
first step, checkpoint events, and the stop handshake (on a stop or SIGTERM: a checkpoint
at the next step, then training ends) — from one callback:

    from trainers.callbacks.hf import GpudCallback          # transformers
    trainer = Trainer(..., callbacks=[GpudCallback()])
    trainer.train(resume_from_checkpoint=trainers.init().resume_from)

    from trainers.callbacks.lightning import GpudCallback   # Lightning
    trainer = L.Trainer(..., callbacks=[GpudCallback()])
    trainer.fit(model, ckpt_path=trainers.init().resume_from)

Each module imports its framework; this package and `trainers` itself import neither, so
neither framework is a dependency of gpud. Outside gpud the callbacks do nothing.
"""
