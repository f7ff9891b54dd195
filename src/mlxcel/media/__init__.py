"""Images in requests: data URIs, safe remote fetching, local files, decoding under limits."""
