"""The job's allocator settings, set before torch initialises CUDA (as a CI job would set them in
its environment): give cached memory back early and do not split large blocks."""

import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF",
                      "garbage_collection_threshold:0.5,max_split_size_mb:128")
