"""Names shared by the predictor's same-answer judge model and its clients.

The predictor serves a second KServe model beside the main one; the transformer asks it whether a new
prompt and a cached prompt have the same answer. Both sides import these names so they cannot drift.
"""

JUDGE_MODEL_SUFFIX = "-judge"
QUERY_INPUT = "query"  # BYTES [1]: the new prompt (last user message)
CACHED_INPUT = "cached"  # BYTES [1]: the cached prompt
PROBABILITY_OUTPUT = "same_answer_probability"  # FP32 [1], in [0, 1]


def judge_model_name(model_name: str) -> str:
    return model_name + JUDGE_MODEL_SUFFIX
