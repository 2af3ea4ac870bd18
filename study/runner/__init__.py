"""The machinery the stages share to run and track a training run: world size and strategy
(``launch``), the run folder's lock, resume key and MLflow ending (``run_state``), progress lines
(``progress``), MLflow (``tracking``, ``mlflow_ui``), throughput loops (``throughput``), the scale
ladder's and arms' run settings (``profiles``, ``arms``).  No stage lives here."""
