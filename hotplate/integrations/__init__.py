"""hotplate inside other programs' pipelines (each an extra: `hotplate[pipecat]`)."""
