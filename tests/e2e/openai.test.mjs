// End-to-end tests of deltaserve's OpenAI-compatible server with the official `openai` client.
// run_e2e.sh starts the servers and sets DS_URL (main, with API key DS_KEY) and DS_URL_SMALL
// (--max-pending 1, its key sk-small from VLLM_API_KEY).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const URL = process.env.DS_URL;
const URL_SMALL = process.env.DS_URL_SMALL;
const URL_SCRIPT = process.env.DS_URL_SCRIPT;
const URL_TOOLS = process.env.DS_URL_TOOLS;
const URL_FORCED = process.env.DS_URL_FORCED;
const KEY = process.env.DS_KEY;
const client = new OpenAI({ baseURL: `${URL}/v1`, apiKey: KEY, maxRetries: 0 });
const models = await client.models.list();
const MODEL = models.data[0].id;

async function metric(name, base = URL) {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(name + '{'));
  assert.ok(line, `metric ${name} missing`);
  return Number(line.split(' ').pop());
}

async function expectStatus(promise, status) {
  await assert.rejects(promise, (e) => {
    assert.equal(e.status, status, `expected ${status}, got ${e.status}: ${e.message}`);
    assert.ok(e.error?.message || e.message, 'error has a message');
    return true;
  });
}

test('models list', () => {
  assert.equal(models.data.length, 1);
  assert.equal(models.data[0].object, 'model');
});

test('completion, not streamed, with usage', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'Hello, my name is', max_tokens: 7, ignore_eos: true });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.ok(r.choices[0].text.length > 0);
  assert.equal(r.usage.completion_tokens, 7);
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 7);
});

test('completion streamed equals the same completion not streamed (greedy)', async () => {
  const params = { model: MODEL, prompt: 'The capital of France is', max_tokens: 10, temperature: 0, ignore_eos: true };
  const full = await client.completions.create(params);
  const stream = await client.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage = null;
  let finish = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(text, full.choices[0].text);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 10);
});

test('chat, not streamed and streamed, with usage', async () => {
  const messages = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Say hi' }];
  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, temperature: 0, ignore_eos: true,
    chat_template_kwargs: { enable_thinking: false } });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.usage.completion_tokens, 6);
  const stream = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 6, temperature: 0,
    ignore_eos: true, chat_template_kwargs: { enable_thinking: false }, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let role = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      text += c.delta.content ?? '';
    }
  }
  assert.equal(role, 'assistant');
  assert.equal(text, r.choices[0].message.content);
  assert.deepEqual(usage, r.usage);
});

test('logprobs on completions and chat', async () => {
  // Greedy: the completions format keys top_logprobs by token text, and two byte pieces of
  // characters both render as U+FFFD, so a sampled continuation can (rarely, seen in CI) reach a
  // position whose two top tokens share one key. This prompt's greedy positions have distinct ones.
  const c = await client.completions.create({ model: MODEL, prompt: 'a b c', max_tokens: 4, logprobs: 2, ignore_eos: true,
    temperature: 0 });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, 4);
  assert.equal(lp.token_logprobs.length, 4);
  for (const v of lp.token_logprobs) assert.ok(v <= 0);
  for (const t of lp.top_logprobs) assert.equal(Object.keys(t).length, 2);
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 3,
    logprobs: true, top_logprobs: 3, ignore_eos: true });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 3);
  for (const e of content) {
    assert.equal(e.top_logprobs.length, 3);
    assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
    assert.ok(e.logprob <= 0);
  }
});

test('stop strings end the text before the match', async () => {
  const params = { model: MODEL, prompt: 'Once upon a time', max_tokens: 16, temperature: 0, ignore_eos: true };
  const full = (await client.completions.create(params)).choices[0].text;
  const chars = [...full];
  const mid = Math.floor(chars.length / 2);
  const stop = chars.slice(mid, mid + 2).join('');
  const expected = full.slice(0, full.indexOf(stop));
  const r = await client.completions.create({ ...params, stop: [stop] });
  assert.equal(r.choices[0].text, expected);
  assert.equal(r.choices[0].finish_reason, 'stop');
  let streamed = '';
  for await (const chunk of await client.completions.create({ ...params, stop, stream: true })) streamed += chunk.choices[0]?.text ?? '';
  assert.equal(streamed, expected);
});

test('seed makes sampling reproducible', async () => {
  const params = { model: MODEL, prompt: 'Random:', max_tokens: 8, temperature: 1.0, top_p: 0.95, seed: 7, ignore_eos: true };
  const a = await client.completions.create(params);
  const b = await client.completions.create(params);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('errors: 400 classes, 404 for another model, 401, 413 and 503', async () => {
  const bad = await fetch(`${URL}/v1/completions`, { method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' }, body: '{"prompt": ' });
  assert.equal(bad.status, 400);
  assert.match((await bad.json()).error.message, /Malformed JSON/);
  await expectStatus(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 'ten' }), 400);
  await expectStatus(client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 }), 404);  // vLLM: NotFoundError
  await expectStatus(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 100000 }), 400);
  await expectStatus(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2, temperature: -1 }), 400);
  await expectStatus(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2, top_p: 7 }), 400);
  await expectStatus(client.chat.completions.create({ model: MODEL, messages: 'hi', max_tokens: 2 }), 400);
  const wrongKey = new OpenAI({ baseURL: `${URL}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await expectStatus(wrongKey.models.list(), 401);
  const big = await fetch(`${URL}/v1/completions`, { method: 'POST', headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: MODEL, prompt: 'x'.repeat(300000) }) });
  assert.equal(big.status, 413);
  // The small server admits one request at a time: concurrent ones get 503.
  const small = new OpenAI({ baseURL: `${URL_SMALL}/v1`, apiKey: 'sk-small', maxRetries: 0 });
  // Its key came from VLLM_API_KEY: another key is refused.
  await expectStatus(new OpenAI({ baseURL: `${URL_SMALL}/v1`, apiKey: 'none', maxRetries: 0 }).models.list(), 401);
  const results = await Promise.allSettled(Array.from({ length: 6 }, () =>
    small.completions.create({ model: MODEL, prompt: 'busy', max_tokens: 24, ignore_eos: true })));
  const ok = results.filter((r) => r.status === 'fulfilled').length;
  const unavailable = results.filter((r) => r.status === 'rejected' && r.reason.status === 503).length;
  assert.ok(ok >= 1, 'at least one request served');
  assert.ok(unavailable >= 1, 'at least one request refused with 503');
  assert.equal(ok + unavailable, 6);
});

test('64 concurrent streams all complete', async () => {
  const runs = Array.from({ length: 64 }, async (_, i) => {
    const stream = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: `request ${i}` }],
      max_tokens: 8, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    let finish = null;
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) if (c.finish_reason) finish = c.finish_reason;
    }
    return { finish, usage };
  });
  const out = await Promise.all(runs);
  for (const r of out) {
    assert.equal(r.finish, 'length');
    assert.equal(r.usage.completion_tokens, 8);
  }
});

test('a client that disconnects mid-stream has its request aborted', async () => {
  const before = await metric('deltaserve_request_aborted_total');
  const stream = await client.completions.create({ model: MODEL, prompt: 'long story', max_tokens: 400, ignore_eos: true, stream: true });
  let n = 0;
  for await (const chunk of stream) {
    if (++n === 2) break;  // leaving the loop aborts the HTTP request
  }
  const deadline = Date.now() + 10000;
  let aborted = before;
  let running = 1;
  while (Date.now() < deadline) {
    aborted = await metric('deltaserve_request_aborted_total');
    running = await metric('deltaserve_num_requests_running');
    if (aborted > before && running === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(aborted, before + 1);
  assert.equal(running, 0);
  assert.equal(await metric('deltaserve_kv_cache_pages_used'), 0);
});

test('tokenize, detokenize and health', async () => {
  const t = await (await fetch(`${URL}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: 'Hello world' }) })).json();
  assert.deepEqual(t.tokens, [9707, 1879]);
  assert.equal(t.count, 2);
  const d = await (await fetch(`${URL}/detokenize`, { method: 'POST', body: JSON.stringify({ tokens: [9707, 1879] }) })).json();
  assert.equal(d.prompt, 'Hello world');
  assert.equal((await fetch(`${URL}/health`)).status, 200);
  const m = await (await fetch(`${URL}/metrics`)).text();
  assert.match(m, /deltaserve_time_to_first_token_seconds_bucket/);
});

// --reasoning-parser qwen3 on a server whose every reply is a fixed token script:
// "<think>\nsix times seven\n</think>\n\nThe answer is 42.".
const scripted = new OpenAI({ baseURL: `${URL_SCRIPT}/v1`, apiKey: 'none', maxRetries: 0 });
const ask = [{ role: 'user', content: 'What is six times seven?' }];

test('reasoning_content, not streamed', async () => {
  const r = await scripted.chat.completions.create({ model: MODEL, messages: ask });
  const m = r.choices[0].message;
  assert.equal(m.reasoning_content.trim(), 'six times seven');
  assert.equal(m.content, 'The answer is 42.');
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('reasoning_content, streamed', async () => {
  const stream = await scripted.chat.completions.create({ model: MODEL, messages: ask, stream: true });
  let reasoning = '', content = '', finish = null;
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(reasoning.trim(), 'six times seven');
  assert.equal(content, 'The answer is 42.');
  assert.equal(finish, 'stop');
});

test('reasoning cut by max_tokens: no content', async () => {
  const r = await scripted.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 3 });
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.choices[0].message.content, null);
  assert.equal(r.choices[0].message.reasoning_content.trim(), 'six');
});

test('thinking off in the template: the scripted reply still parses, completions keep raw text', async () => {
  const r = await scripted.chat.completions.create({
    model: MODEL, messages: ask, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(r.choices[0].message.content, 'The answer is 42.');
  const c = await scripted.completions.create({ model: MODEL, prompt: 'x', max_tokens: 32 });
  assert.ok(c.choices[0].text.startsWith('<think>'), 'completions are not parsed');
});

test('vLLM surface: /version, /ping and vllm: metric names', async () => {
  const v = await (await fetch(`${URL_SCRIPT}/version`)).json();
  assert.ok(typeof v.version === 'string' && v.version.length > 0);
  assert.equal((await fetch(`${URL_SCRIPT}/ping`)).status, 200);
  assert.ok((await metric('vllm:generation_tokens_total', URL_SCRIPT)) > 0);
});

test('vLLM surface: 404 routes, keep-alive, Retry-After, max_completion_tokens, unsupported schemas refused', async () => {
  assert.equal((await fetch(`${URL_SCRIPT}/v1/no-such-route`)).status, 404);
  const models = await fetch(`${URL_SCRIPT}/v1/models`);
  assert.equal(models.status, 200);
  assert.notEqual(models.headers.get('connection'), 'close', 'a whole JSON reply keeps the connection');
  const short = await scripted.chat.completions.create({ model: MODEL, messages: ask, max_completion_tokens: 3 });
  assert.equal(short.usage.completion_tokens, 3);
  assert.equal(short.choices[0].finish_reason, 'length');
  await assert.rejects(scripted.chat.completions.create({ model: MODEL, messages: ask,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: 'a+' } } } }),
  (e) => e.status === 400 && /pattern/.test(e.message));
  await assert.rejects(scripted.completions.create({ model: MODEL, prompt: 'x', structured_outputs: { regex: 'a+' } }),
    (e) => e.status === 400 && /structured_outputs/.test(e.message));
  // The small server admits one request at a time: a refused one says when to come back.
  const body = JSON.stringify({ model: MODEL, prompt: 'busy', max_tokens: 24, ignore_eos: true });
  const replies = await Promise.all(Array.from({ length: 6 }, () => fetch(`${URL_SMALL}/v1/completions`,
    { method: 'POST', headers: { Authorization: 'Bearer sk-small', 'Content-Type': 'application/json' }, body })));
  const refused = replies.filter((r) => r.status === 503);
  assert.ok(refused.length >= 1, 'at least one 503');
  for (const r of refused) assert.ok(Number(r.headers.get('retry-after')) >= 1, 'Retry-After on a 503');
  await Promise.all(replies.map((r) => r.text()));
});

// Structured outputs on the random-weight model: only the constraint makes its text a document.
// The schema bounds the document's length, so within max_tokens every reply is whole.
const answerSchema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer' },
  color: { enum: ['red', 'green', 'dark blue'] } }, required: ['ok', 'n', 'color'], additionalProperties: false };
function checkAnswer(text) {
  const doc = JSON.parse(text);
  assert.deepEqual(Object.keys(doc).sort(), ['color', 'n', 'ok'], text);
  assert.equal(typeof doc.ok, 'boolean', text);
  assert.ok(Number.isInteger(doc.n), text);
  assert.ok(['red', 'green', 'dark blue'].includes(doc.color), text);
}

test('response_format json_schema: replies match the schema, streamed and not', async () => {
  const response_format = { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema: answerSchema } };
  const r = await client.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 400, seed: 3, response_format });
  assert.equal(r.choices[0].finish_reason, 'stop');
  checkAnswer(r.choices[0].message.content);
  const stream = await client.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 400, seed: 4,
    response_format, stream: true });
  let text = '';
  let finish = null;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'stop');
  checkAnswer(text);
  // vLLM's structured_outputs.json on completions.
  const c = await client.completions.create({ model: MODEL, prompt: 'JSON:', max_tokens: 400, seed: 5,
    structured_outputs: { json: answerSchema } });
  assert.equal(c.choices[0].finish_reason, 'stop');
  checkAnswer(c.choices[0].text);
});

test('structured_outputs.choice: the reply is one of the choices', async () => {
  const choices = ['positive', 'negative', 'neutral (mixed)'];
  for (const seed of [1, 2, 3]) {
    const r = await client.completions.create({ model: MODEL, prompt: 'Sentiment:', max_tokens: 32, seed,
      structured_outputs: { choice: choices } });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.ok(choices.includes(r.choices[0].text), r.choices[0].text);
  }
});

test('response_format json_object: the reply opens an object, and parses when it ends', async () => {
  for (const seed of [1, 2]) {
    const r = await client.chat.completions.create({ model: MODEL, messages: ask, max_tokens: 64, seed,
      response_format: { type: 'json_object' } });
    const text = r.choices[0].message.content;
    assert.match(text, /^\s*\{/);
    if (r.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object');
  }
});

// --enable-auto-tool-choice --tool-call-parser qwen3_coder on a server whose every reply is
// "Checking.\n<tool_call>\n<function=get_weather>...city Paris, days 3...</tool_call>".
const tooled = new OpenAI({ baseURL: `${URL_TOOLS}/v1`, apiKey: 'none', maxRetries: 0 });
const weatherTools = [{ type: 'function', function: { name: 'get_weather', description: 'weather',
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } },
    required: ['city'] } } }];
const weatherAsk = [{ role: 'user', content: 'Weather in Paris for 3 days?' }];

test('tool calls, not streamed', async () => {
  const r = await tooled.chat.completions.create({ model: MODEL, messages: weatherAsk, tools: weatherTools });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content.trim(), 'Checking.');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.ok(m.tool_calls[0].id.startsWith('call_'));
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', days: 3 });
});

test('tool calls, streamed', async () => {
  const stream = await tooled.chat.completions.create({ model: MODEL, messages: weatherAsk, tools: weatherTools, stream: true });
  let content = '', finish = null, callChunks = 0;
  const calls = [];
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta ?? {};
    content += d.content ?? '';
    for (const c of d.tool_calls ?? []) {
      if (!calls[c.index]) {  // a call's first delta: id, type and name
        assert.ok(c.id?.startsWith('call_') && c.type === 'function' && c.function?.name, JSON.stringify(c));
      }
      calls[c.index] ??= { name: '', arguments: '' };
      calls[c.index].name += c.function?.name ?? '';
      calls[c.index].arguments += c.function?.arguments ?? '';
    }
    if (d.tool_calls?.length) ++callChunks;
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.ok(callChunks >= 3, `the call streams in pieces (name, city, days), got ${callChunks} chunks`);
  assert.equal(finish, 'tool_calls');
  assert.equal(content.trim(), 'Checking.');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(calls[0].arguments), { city: 'Paris', days: 3 });
});

test('tool_choice none, the tool result turn, and bad tool choices refused', async () => {
  const none = await tooled.chat.completions.create({ model: MODEL, messages: weatherAsk, tools: weatherTools, tool_choice: 'none' });
  assert.equal(none.choices[0].finish_reason, 'stop');
  assert.ok(none.choices[0].message.content.includes('<tool_call>'), 'no parsing with tool_choice none');
  const first = await tooled.chat.completions.create({ model: MODEL, messages: weatherAsk, tools: weatherTools });
  const call = first.choices[0].message.tool_calls[0];
  const followUp = await tooled.chat.completions.create({ model: MODEL, tools: weatherTools, messages: [
    ...weatherAsk,
    { role: 'assistant', content: null, tool_calls: [call] },
    { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' }] });
  assert.equal(followUp.choices.length, 1);
  await expectStatus(tooled.chat.completions.create({ model: MODEL, messages: weatherAsk, tool_choice: 'required' }), 400);
  await expectStatus(tooled.chat.completions.create({ model: MODEL, messages: weatherAsk, tools: weatherTools,
    tool_choice: { type: 'function', function: { name: 'get_date' } } }), 400);
  await expectStatus(client.chat.completions.create({ model: MODEL, messages: weatherAsk, tools: weatherTools, tool_choice: 'auto' }), 400);
});

// tool_choice "required" / a named function on a server (no tool-call parser flag) whose "model"
// always answers with a get_time call: the reply's opening is forced to the chosen tool's.
const forcedClient = new OpenAI({ baseURL: `${URL_FORCED}/v1`, apiKey: 'none', maxRetries: 0 });
const twoTools = [...weatherTools, { type: 'function', function: { name: 'get_time', description: 'time',
  parameters: { type: 'object', properties: { zone: { type: 'string' } } } } }];
const timeAsk = [{ role: 'user', content: 'What time is it in UTC?' }];

async function streamedCalls(body) {
  const stream = await forcedClient.chat.completions.create({ ...body, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices[0]?.delta?.tool_calls ?? []) {
      calls[c.index] ??= { name: '', arguments: '' };
      calls[c.index].name += c.function?.name ?? '';
      calls[c.index].arguments += c.function?.arguments ?? '';
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { calls, finish };
}

test('tool_choice required keeps the model\'s choice of tool, finish_reason tool_calls', async () => {
  const body = { model: MODEL, messages: timeAsk, tools: twoTools, tool_choice: 'required' };
  const r = await forcedClient.chat.completions.create(body);
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  const calls = r.choices[0].message.tool_calls;
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, 'get_time');
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { zone: 'UTC' });
  const s = await streamedCalls(body);
  assert.equal(s.finish, 'tool_calls');
  assert.deepEqual(s.calls.map((c) => c.name), ['get_time']);
});

test('a named tool_choice forces that function, finish_reason stop (as OpenAI and vLLM)', async () => {
  const pick = (name) => ({ model: MODEL, messages: timeAsk, tools: twoTools,
    tool_choice: { type: 'function', function: { name } } });
  const time = await forcedClient.chat.completions.create(pick('get_time'));
  assert.equal(time.choices[0].finish_reason, 'stop');
  assert.equal(time.choices[0].message.tool_calls[0].function.name, 'get_time');
  assert.deepEqual(JSON.parse(time.choices[0].message.tool_calls[0].function.arguments), { zone: 'UTC' });
  // The model wanted get_time; get_weather is what it must call.
  const weather = await forcedClient.chat.completions.create(pick('get_weather'));
  assert.equal(weather.choices[0].finish_reason, 'stop');
  assert.equal(weather.choices[0].message.tool_calls[0].function.name, 'get_weather');
  const s = await streamedCalls(pick('get_weather'));
  assert.equal(s.finish, 'stop');
  assert.equal(s.calls[0].name, 'get_weather');
  // Without a tool choice this server parses nothing (no --enable-auto-tool-choice).
  const plain = await forcedClient.chat.completions.create({ model: MODEL, messages: timeAsk, tools: twoTools });
  assert.equal(plain.choices[0].message.tool_calls, undefined);
  assert.ok(plain.choices[0].message.content.includes('<function=get_time>'));
});

test('echo puts the prompt before the completion, streamed and not', async () => {
  const r = await scripted.completions.create({ model: MODEL, prompt: 'Q: 6*7?', max_tokens: 3, echo: true });
  assert.ok(r.choices[0].text.startsWith('Q: 6*7?<think>'), r.choices[0].text);
  const stream = await scripted.completions.create({ model: MODEL, prompt: 'Q: 6*7?', max_tokens: 3, echo: true, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
  await expectStatus(scripted.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2, echo: true, logprobs: 1 }), 400);
});

test('logit_bias steers the choice', async () => {
  const r = await client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 3, temperature: 0,
    logit_bias: { '9707': 100 } });
  assert.equal(r.choices[0].text, 'HelloHelloHello');
  await expectStatus(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2, logit_bias: { '9707': 1000 } }), 400);
  await expectStatus(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 2, logit_bias: { 'abc': 1 } }), 400);
});

test('n samples of one prompt prefill it once: the others resume from its cache', async () => {
  const prompt = Array.from({ length: 200 }, (_, i) => 1000 + ((i * 7919) % 50000));  // never seen
  const before = await metric('vllm:prefix_cache_hits_total');
  const r = await client.completions.create({ model: MODEL, prompt, n: 3, max_tokens: 4, temperature: 1, seed: 3 });
  assert.equal(r.choices.length, 3);
  // Samples 2 and 3 resume at the last 64-token grid point before the prompt's end (192).
  assert.equal((await metric('vllm:prefix_cache_hits_total')) - before, 2 * 192);
});

test('n choices and a list of prompts, streamed and not', async () => {
  const base = { model: MODEL, max_tokens: 5, temperature: 0, ignore_eos: true };
  const one = await client.completions.create({ ...base, prompt: 'Paris is' });
  const r = await client.completions.create({ ...base, prompt: ['Paris is', 'Rome is'], n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.equal(r.choices[0].text, one.choices[0].text);  // greedy: every sample of a prompt agrees
  assert.equal(r.choices[1].text, one.choices[0].text);
  assert.equal(r.usage.completion_tokens, 20);
  const rome = await client.completions.create({ ...base, prompt: 'Rome is' });
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens + rome.usage.prompt_tokens);  // once each
  assert.equal(r.choices[3].text, rome.choices[0].text);
  const texts = ['', '', '', ''];
  const finished = [null, null, null, null];
  const stream = await client.completions.create({ ...base, prompt: ['Paris is', 'Rome is'], n: 2, stream: true });
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      texts[c.index] += c.text;
      if (c.finish_reason) finished[c.index] = c.finish_reason;
    }
  assert.deepEqual(texts, r.choices.map((c) => c.text));
  assert.deepEqual(finished, ['length', 'length', 'length', 'length']);
  const chat = await client.chat.completions.create({
    model: MODEL, messages: [{ role: 'user', content: 'Say hi' }], n: 3, max_tokens: 4, temperature: 1, seed: 5,
  });
  assert.deepEqual(chat.choices.map((c) => c.index), [0, 1, 2]);
  assert.ok(chat.usage.completion_tokens >= 3 && chat.usage.completion_tokens <= 12, `usage ${chat.usage.completion_tokens}`);
  for (const c of chat.choices) assert.equal(c.message.role, 'assistant');
  await expectStatus(client.completions.create({ ...base, prompt: 'x', n: 0 }), 400);
});

test('prefix cache: a repeated prompt resumes from the cache (cached_tokens, vllm: metrics, same text)', async () => {
  const prompt = Array.from({ length: 150 }, (_, i) => 1000 + ((i * 7919) % 4000));
  const params = { model: MODEL, prompt, max_tokens: 6, temperature: 0, ignore_eos: true };
  const hitsBefore = await metric('vllm:prefix_cache_hits_total');
  const first = await client.completions.create(params);
  const second = await client.completions.create(params);
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  assert.equal(second.usage.prompt_tokens_details.cached_tokens, 128); // the last 64-grid point before 150
  assert.equal(second.choices[0].text, first.choices[0].text);
  assert.equal((await metric('vllm:prefix_cache_hits_total')) - hitsBefore, 128);
  assert.ok((await metric('vllm:prefix_cache_queries_total')) >= 300);
});

test('return_token_ids: prompt and output ids, streamed and not', async () => {
  const params = { model: MODEL, prompt: 'Count with me: one, two', max_tokens: 5, temperature: 0, ignore_eos: true, return_token_ids: true };
  const full = await client.completions.create(params);
  const c = full.choices[0];
  assert.equal(c.prompt_token_ids.length, full.usage.prompt_tokens);
  assert.equal(c.token_ids.length, 5);
  const stream = await client.completions.create({ ...params, stream: true });
  const ids = [];
  let promptIds = null;
  for await (const chunk of stream) {
    for (const ch of chunk.choices) {
      if (ch.prompt_token_ids) promptIds = ch.prompt_token_ids;
      ids.push(...(ch.token_ids ?? []));
    }
  }
  assert.deepEqual(ids, c.token_ids);
  assert.deepEqual(promptIds, c.prompt_token_ids);
});
