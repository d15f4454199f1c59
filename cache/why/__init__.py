"""Why a request missed the cache: departed entries, the explanation, the counts."""
