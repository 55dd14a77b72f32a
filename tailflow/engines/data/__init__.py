"""Training and eval data: the embedded arithmetic task and its character tokenizer, the code task, JSONL / Parquet
datasets, the `Problem` record every dataset yields, and the cursor that says where a run is in its data.
It imports nothing else of engines/: tail batching, the rollout requests and the rewards see a dataset only as
`Problem`s, so a new data format is a change here alone."""
