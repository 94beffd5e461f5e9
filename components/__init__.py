"""Retrain's pipeline definition: WHAT runs. One contract, and two twins that run it.

The contract, here: the component YAMLs (prep, train, evaluate, register, drift; pipeline.yml binds them),
the training environment and compute specs, and what every runner and the front door share. The steps call
into `training/` by command line only, never by import, so a step's code and the pipeline's definition
version independently.

    request.py            a run as a value (RunRequest, DataRef), a Submission, the Submitter protocol
    submitters.py         the registry: RETRAIN_SUBMITTER's name -> its twin's builder, imported when chosen
    specs.py              the YAMLs read as plain data (PyYAML only); the step and output names code uses
    parameters.py         which parameters a run may set, and the values each accepts
    run_inputs.py         the pipeline inputs a run sets itself, the same on every runner
    run_settings.py       what a `retrain run|submit` trains: the model's file with the command line over it
    model_config.py       one model's configuration file (models/<name>.toml)
    task_ref.py           a run's task reference and options, as the pipeline carries them
    task_declarations.py  what a user's task declares of its raw files, read without running it
    checkpoint_key.py     the key a training's checkpoints live under, so a rerun resumes
    data_version.py       raw data versions: a manifest of every input file, pinned as an immutable copy
    fingerprint.py        what a code folder holds, hashed as a step's cache and a code snapshot read it
    preflight.py          the task loads and reports the gate's metrics, checked before anything runs
    outcome.py            what became of a run, in words: the gate's decision beside the status
    cost.py               what a run is about to spend on Azure ML, estimated before it is sent
    errors.py             the pipeline layer's errors, one line each

    azureml/              the Azure ML twin: the job builder, the submitter and its dry run, the workspace
                          seam, code and blob snapshots, data assets, publishing, schedules, `retrain submit`
    local/                the local twin (not deployed): the runner that executes the YAMLs' command lines
                          here, its submitter, warm starts, `retrain run|runs|init`, local retention
"""
