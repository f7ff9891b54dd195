// The playground's own logic, run by tests/test_webui.py in the page: each case is true or says
// what it got.
async () => {
  const { renderMarkdown } = await import("/webui/markdown.js");
  const { SseParser } = await import("/webui/api.js");
  const { describeModels } = await import("/webui/models.js");
  const { requestBody } = await import("/webui/settings.js");
  const { streamStats, statsText } = await import("/webui/chat.js");
  const { availablePanels, cosine, ranked, scoreInput } = await import("/webui/tools.js");
  const { defaultSettings, newConversation, titleOf } = await import("/webui/store.js");
  const { formatBytes, formatSeconds, pullProgress, servedName } = await import("/webui/hub.js");
  const { pcm16Base64, pcm16Samples, realtimeUrl, sessionUpdate } = await import("/webui/realtime.js");

  const results = {};
  const same = (got, want) =>
    JSON.stringify(got) === JSON.stringify(want) || `${JSON.stringify(got)} != ${JSON.stringify(want)}`;
  const has = (text, ...parts) =>
    parts.every((part) => text.includes(part)) || `${JSON.stringify(text)} lacks one of ${parts}`;
  const check = (name, run) => {
    try {
      results[name] = run();
    } catch (error) {
      results[name] = `threw ${error.message}`;
    }
  };
  const settings = (fields) => ({ ...defaultSettings(), ...fields });
  const hello = [{ role: "user", content: "hi" }];

  check("markdown escapes html", () => {
    const html = renderMarkdown('<img src=x onerror="alert(1)"> & <script>x</script>');
    return !html.includes("<img") && !html.includes("<script") ? true : html;
  });
  check("markdown links only http and mailto", () => {
    const html = renderMarkdown("[a](javascript:alert(1)) [b](https://example.com/x)");
    if (html.includes('href="javascript')) return html;
    return has(html, '<a href="https://example.com/x" target="_blank" rel="noopener noreferrer">b</a>');
  });
  check("markdown inline", () =>
    same(renderMarkdown("**b** *i* ~~s~~ `a*b*` snake_case_name"),
      "<p><strong>b</strong> <em>i</em> <del>s</del> <code>a*b*</code> snake_case_name</p>"),
  );
  check("markdown code block", () =>
    has(renderMarkdown("```python\ndef f(): return 'x'  # no\n```"),
      '<span class="tok-k">def</span>', '<span class="tok-s">&#39;x&#39;</span>',
      '<span class="tok-c"># no</span>', 'class="copy-code"', "<span>python</span>"),
  );
  check("markdown open fence while streaming", () =>
    has(renderMarkdown("text\n```js\nlet a = 1"), "<p>text</p>", '<span class="tok-k">let</span>'),
  );
  check("markdown nested list", () =>
    same(renderMarkdown("- a\n  - b\n- c\n\n3. x\n4. y"),
      '<ul><li>a<ul><li>b</li></ul></li><li>c</li></ul><ol start="3"><li>x</li><li>y</li></ol>'),
  );
  check("markdown table", () =>
    has(renderMarkdown("| a | b |\n|---|--:|\n| 1 | 2 |"),
      "<th>a</th>", '<td class="align-right">2</td>'),
  );
  check("markdown heading quote rule", () =>
    same(renderMarkdown("## T\n> q\n\n---"), "<h2>T</h2><blockquote><p>q</p></blockquote><hr>"),
  );

  check("sse split anywhere", () => {
    const parser = new SseParser();
    const first = parser.push('data: {"a"');
    const second = parser.push(':1}\r\n\r\n: ping\n\ndata: [DO');
    const third = parser.push("NE]\n\n");
    return same([first, second, third], [[], ['{"a":1}'], ["[DONE]"]]);
  });

  check("models without capabilities serve chat", () => {
    const [model] = describeModels({ data: [{ id: "m", object: "model" }] });
    return same([model.id, [...model.capabilities], model.state], ["m", ["chat"], null]);
  });
  check("models with state and capabilities", () => {
    const models = describeModels({
      data: [
        { id: "e", state: "unloaded", capabilities: ["embeddings"] },
        { id: "v", capabilities: { chat: true, vision: true, rerank: false } },
        { id: "r", status: { value: "loading" } },
        { id: "f", state: "failed", reason: "out of memory", capabilities: ["text"] },
        { id: "s", meta: { capabilities: ["tts"] } },
      ],
    });
    return same(models.map((m) => [m.id, [...m.capabilities].sort(), m.state, m.reason]), [
      ["e", ["embedding"], "unloaded", null],
      ["v", ["chat", "vision"], null, null],
      ["r", ["chat"], "loading", null],
      ["f", ["chat"], "failed", "out of memory"],
      ["s", ["speech"], null, null],
    ]);
  });
  check("panels appear only for served capabilities", () => {
    const chatOnly = availablePanels(describeModels({ data: [{ id: "c" }] }));
    const withEmbedding = availablePanels(
      describeModels({ data: [{ id: "c" }, { id: "e", capabilities: ["embedding"] }] }),
    );
    return same([chatOnly.length, withEmbedding.map((p) => [p.id, p.models])],
      [0, [["scores", [{ id: "e", capability: "embedding" }]]]]);
  });

  check("live audio goes out as pcm16 and comes back the same", () => {
    const samples = new Float32Array([0, 0.5, -0.5, 1, -1, 0.25]);
    const back = Array.from(pcm16Samples(pcm16Base64(samples)), (x) => Math.round(x * 1000) / 1000);
    return same([atob(pcm16Base64(samples)).length, back], [12, [0, 0.5, -0.5, 1, -1, 0.25]]);
  });

  check("the live session's url and first update", () =>
    same(
      [
        realtimeUrl({ protocol: "https:", host: "h:1" }, "transcribe"),
        realtimeUrl({ protocol: "http:", host: "h:1" }, "talk"),
        sessionUpdate("transcribe", "w").session.type,
        sessionUpdate("talk", "w").session.audio.input.turn_detection.type,
      ],
      ["wss://h:1/v1/realtime?intent=transcription", "ws://h:1/v1/realtime", "transcription", "server_vad"],
    ));

  check("request leaves empty settings to the server", () =>
    same(requestBody(settings({}), "m", hello), {
      model: "m", messages: hello, stream: true, stream_options: { include_usage: true },
    }),
  );
  check("request carries settings", () => {
    const body = requestBody(
      settings({ system: "sys", temperature: "0.5", top_k: "3", seed: "0", format: "json_object",
        extra: '{"ignore_eos": true}' }),
      "m", hello,
    );
    return same(body, {
      model: "m", messages: [{ role: "system", content: "sys" }, ...hello], stream: true,
      stream_options: { include_usage: true }, temperature: 0.5, top_k: 3, seed: 0,
      response_format: { type: "json_object" }, ignore_eos: true,
    });
  });
  check("request refuses bad settings", () => {
    const reasons = [];
    for (const bad of [{ top_k: "1.5" }, { format: "json_schema", schema: "{" }, { extra: "[]" }]) {
      try {
        requestBody(settings(bad), "m", hello);
        reasons.push("accepted");
      } catch (error) {
        reasons.push(error.message.split(" ")[0]);
      }
    }
    return same(reasons, ["Top", "The", "Extra"]);
  });
  check("request sends images as parts", () =>
    same(requestBody(settings({}), "m", [{ role: "user", content: "see", images: ["data:x"] }]).messages,
      [{ role: "user", content: [{ type: "text", text: "see" },
        { type: "image_url", image_url: { url: "data:x" } }] }]),
  );

  check("stats from the stream", () => {
    const usage = { completion_tokens: 11, prompt_tokens: 7, prompt_tokens_details: { cached_tokens: 3 } };
    const stats = streamStats(0, 100, 5, usage, 1100);
    if (stats.ttft !== 100 || stats.tps !== 10) return same(stats, "ttft 100, tps 10");
    return same(statsText(stats), "11 tokens · 10.0 tok/s · first token 100 ms · prompt 7 (3 cached)");
  });
  check("stats before the first token", () =>
    same(streamStats(0, null, 0, undefined, 50), { ttft: null, tokens: 0, tps: null }),
  );

  check("scores rank documents", () => {
    const scores = [cosine([1, 0], [1, 0]), cosine([1, 0], [0, 2]), cosine([0, 0], [1, 1])];
    return same([scores, ranked(["a", "b"], [0.1, 0.9]).map((r) => r.text)], [[1, 0, 0], ["b", "a"]]);
  });
  check("an image query leads the embedding input", () => {
    const url = "data:image/png;base64,AAAA";
    return same([scoreInput("q", null, ["d"]), scoreInput("q", url, ["d"])],
      [["q", "d"], [{ type: "image_url", image_url: { url } }, "d"]]);
  });
  check("a multi-vector model is marked for MaxSim", () => {
    const models = describeModels({ data: [
      { id: "colbert", capabilities: ["embedding", "rerank"], multi_vector: true },
      { id: "clip", capabilities: ["embedding"], multi_vector: false },
    ] });
    return same(availablePanels(models).map((p) => p.models), [[
      { id: "colbert", capability: "rerank", multiVector: true },
      { id: "colbert", capability: "embedding", multiVector: true },
      { id: "clip", capability: "embedding" },
    ]]);
  });
  check("titles", () => {
    const conversation = newConversation("m");
    const empty = titleOf(conversation);
    conversation.messages.push({ role: "user", content: `${"word ".repeat(20)}\nend` });
    const long = titleOf(conversation);
    conversation.title = "Named";
    return same([empty, long.length, long.endsWith("…"), titleOf(conversation)],
      ["New chat", 48, true, "Named"]);
  });
  check("byte sizes", () =>
    same([0, 1023, 1536, 98362432, 5 * 2 ** 30, -1, undefined].map(formatBytes),
      ["0 B", "1023 B", "1.5 KiB", "93.8 MiB", "5.0 GiB", "–", "–"]),
  );
  check("durations", () =>
    same([4.4, 125, 7322, null].map(formatSeconds), ["4 s", "2 min 5 s", "2 h 2 min", ""]),
  );
  check("pull progress", () => {
    const mib = 2 ** 20;
    const running = { type: "progress", done_bytes: 12 * mib, total_bytes: 48 * mib, rate_bytes_per_s: 2 * mib, eta_s: 18 };
    return same([
      pullProgress(running),
      pullProgress({ status: "running", done_bytes: 0, total_bytes: 0 }),
      pullProgress({ type: "done", done_bytes: 48 * mib, total_bytes: 48 * mib }),
      pullProgress({ type: "failed", done_bytes: mib, total_bytes: 4 * mib, error: "offline" }),
      pullProgress({ type: "cancelled", done_bytes: mib, total_bytes: 4 * mib }),
    ], [
      { fraction: 0.25, text: "25% · 12.0 MiB of 48.0 MiB · 2.0 MiB/s · 18 s left" },
      { fraction: null, text: "0 B" },
      { fraction: 1, text: "Done: 48.0 MiB" },
      { fraction: 0.25, text: "Failed: offline" },
      { fraction: 0.25, text: "Cancelled at 25% · 1.0 MiB of 4.0 MiB" },
    ]);
  });
  check("served names", () =>
    same(["org/Foo-GGUF:Foo-Q4_K_M.gguf", "mlx-community/Qwen3 0.6B", "default (embedding)", ":"].map(servedName),
      ["foo-q4_k_m", "qwen3-0.6b", "default-embedding", "model"]),
  );
  return results;
};
