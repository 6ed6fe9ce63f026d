// The page of `aiayn serve`: translate a sentence or a small document (with a glossary), show it
// sentence by sentence with each word coloured by its probability, then draw what the model attended
// to in the sentence chosen. A word clicked shows the model's other choices there; taking one, or
// editing the sentence and asking for the rest, decodes the rest again from that prefix. On a server
// of several models a language pair is chosen; a pair no model translates goes through a bridge
// language (a pivot), and the page says the path taken and the bridge sentence the last model read.
// A file (a text, Word or web document...) is translated whole in the pair chosen, as LibreTranslate's
// page does it (POST /translate_file), and given back as a link to download it.
// Plain JavaScript, SVG and canvas; no library and no network beyond this server's own API.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG_NS = "http://www.w3.org/2000/svg";
// sentences: [source, translation] pairs; words: per sentence its [word, probability] pairs;
// prefixes: per sentence the prefix its translation was decoded from ("" at first); layout: the
// document's text around its sentences (null: shown as plain text); selected: the sentence chosen;
// languages: GET /languages' sources that have targets, names: each code's name; pair: the source
// and target of the translation shown ({} on a server that does not know its model's languages);
// several: the server serves several models (GET /v1/model needs a pair); files: its file settings
// (GET /frontend/settings; null where it has none)
const state = {
  model: null, attention: null, options: null, sentences: [], words: [], prefixes: [], layout: null,
  text: "", selected: 0, languages: [], names: {}, pair: {}, several: false, files: null,
};
const CHOICES = 5; // how many of the model's choices a word shows

// The attention kinds of the API, as plots.ATTENTION_KINDS names them: title, query side, key side.
const KINDS = {
  encoder_self: ["encoder self-attention", "source", "source"],
  decoder_self: ["decoder self-attention", "target", "target"],
  cross: ["cross-attention (decoder → encoder)", "target", "source"],
};

// Colour maps as stops between 0 and 1: matplotlib's viridis and RdBu, sampled.
const VIRIDIS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779",
  "#6ece58", "#fde725"];
const RDBU = ["#67001f", "#b2182b", "#d6604d", "#f4a582", "#fddbc7", "#f7f7f7",
  "#d1e5f0", "#92c5de", "#4393c3", "#2166ac", "#053061"];
// One colour per head (as in bertviz's head view); the average of all heads is drawn in ink.
const HEAD_COLOURS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const AVERAGE_COLOUR = "#1d2b53";
// A word's background by its probability: strong for an unsure word, white for a sure one.
const CONFIDENCE = ["#d6604d", "#f4a582", "#fddbc7", "#fbf3ec", "#ffffff"];

// --- talking to the server -----------------------------------------------------------------------

// The API key field is kept in sessionStorage (this tab only) and sent when it is set.
function apiHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

// One JSON request; a 4xx/5xx answer throws an Error carrying the server's one-line message.
async function api(method, path, body) {
  const response = await fetch(path, {
    method, headers: apiHeaders(), body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) throw Object.assign(new Error(errorText(data, response)), { status: response.status });
  return data;
}

// {"error": "..."} is the server's form; FastAPI's own {"detail": ...} is understood too.
function errorText(data, response) {
  if (data && typeof data.error === "string") return data.error;
  if (data && data.detail !== undefined) {
    return typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail);
  }
  return `HTTP ${response.status} ${response.statusText}`;
}

// --- the model's description -----------------------------------------------------------------------

// The one model's description (GET /v1/model); a server of several models (GET /v1/models) has none
// without a pair: its models are listed until a translation names a pair, then the model of that
// pair (its last model, for a pivot; loaded by then) is described.
async function loadModel(pair = {}) {
  try {
    if (!pair.source) {
      const { models } = await api("GET", "/v1/models");
      state.several = models.length > 1;
      if (state.several) return listModels(models);
    }
    state.model = await api("GET", `/v1/model${pair.source ? `?${new URLSearchParams(pair)}` : ""}`);
    $("model-info").textContent = (state.several ? `${state.model.name}: ` : "") + describeModel(state.model);
    drawPositionalEncoding(modelConfig().d_model || 512, Math.min(modelConfig().max_len || 100, 100));
  } catch (err) {
    $("model-info").textContent = `model description unavailable: ${err.message}`;
  }
}

// "2 models, each loaded on first use: de_en (de → en) · en_fr (en → fr)"
function listModels(models) {
  const each = models.map((m) => `${m.name} (${languages(m.languages)})`);
  $("model-info").textContent = `${models.length} models, each loaded on first use: ${each.join(" · ")}`;
}

function modelConfig() {
  return (state.model && (state.model.config || state.model)) || {};
}

// "digits → words · d_model 128 · 4 heads · 2 + 2 layers · 1,234 parameters"
function describeModel(info) {
  const c = modelConfig();
  const parts = [];
  const langs = languages(info.languages);
  if (langs) parts.push(langs);
  parts.push(`d_model ${c.d_model}`, `${c.n_heads} heads`,
    `${c.n_encoder_layers} encoder + ${c.n_decoder_layers} decoder layers`);
  const n = typeof info.parameters === "object" && info.parameters ? info.parameters.total : info.parameters;
  if (n !== undefined) parts.push(`${Number(n).toLocaleString("en")} parameters`);
  return parts.join(" · ");
}

function languages(langs) {
  if (!langs) return "";
  if (Array.isArray(langs)) return langs.join(" → ");
  if (typeof langs === "string") return langs;
  const side = (codes) => [].concat(codes || []).join("+"); // a code, or a model's list of them
  const src = side(langs.source || langs.src), tgt = side(langs.target || langs.tgt);
  return src || tgt ? `${src || "?"} → ${tgt || "?"}` : "";
}

// --- the language pair -------------------------------------------------------------------------

// The pickers, from GET /languages: every source that has targets, and "auto" (the server detects
// it); a server that does not know its model's languages answers [] (a forecasting one, 404): the
// pickers stay hidden and requests name no pair, as its one model needs none.
async function loadLanguages() {
  const listed = await api("GET", "/languages").catch(() => []);
  state.names = Object.fromEntries(listed.map((language) => [language.code, language.name]));
  state.languages = listed.filter((language) => language.targets.length);
  $("languages").hidden = !state.languages.length;
  if (!state.languages.length) return;
  const sources = state.languages.map((language) => new Option(named(language.code), language.code));
  $("source-lang").replaceChildren(new Option("detect the language", "auto"), ...sources);
  $("source-lang").value = state.languages[0].code;
  fillTargets();
}

// The targets of the source chosen (for auto, every target any source reaches), each pivoted one with
// its bridge languages; the target chosen before stays chosen where it still is one.
function fillTargets() {
  const source = $("source-lang").value, before = $("target-lang").value;
  const from = state.languages.filter((language) => source === "auto" || language.code === source);
  const targets = [...new Set(from.flatMap((language) => language.targets))].sort();
  const through = (code) => (from.length === 1 && from[0].pivots && from[0].pivots[code]) || [];
  $("target-lang").replaceChildren(...targets.map((code) => {
    const bridges = through(code).map((bridge) => named(bridge));
    return new Option(named(code) + (bridges.length ? `, through ${bridges.join(", ")}` : ""), code);
  }));
  if (targets.includes(before)) $("target-lang").value = before;
}

// The pair chosen, for a request's body: {} where the pickers are hidden.
function chosenPair() {
  if ($("languages").hidden) return {};
  return { source: $("source-lang").value, target: $("target-lang").value };
}

// "German (de)"; a code the server has no name for is shown alone; `more` goes in the brackets.
function named(code, ...more) {
  const name = state.names[code] || code;
  const inBrackets = [...(name === code ? [] : [code]), ...more].join(", ");
  return inBrackets ? `${name} (${inBrackets})` : name;
}

// The path of a translation: "de → en → fr (models de_en, en_fr)", "de → en (model de_en)"; with
// auto, what was detected: "detected: German (de, 97%)". "" where the languages are unknown.
function routeText(answer) {
  const route = answer.route || [];
  if (!route.length || route.some((step) => !step.source || !step.target)) return "";
  const path = [route[0].source, ...route.map((step) => step.target)].join(" → ");
  const models = `model${route.length > 1 ? "s" : ""} ${route.map((step) => step.model).join(", ")}`;
  const found = answer.detected;
  const detected = found ? ` · detected: ${named(found.language, `${Math.round(found.confidence)}%`)}` : "";
  return `${path} (${models})${detected}`;
}

// --- a file --------------------------------------------------------------------------------------

// The file part, where the server translates files (GET /frontend/settings: LibreTranslate's; a
// forecasting server has none, 404) and knows its models' languages (the pickers shown: the server
// needs a file's pair named); the file input offers the extensions the server reads.
async function loadFiles() {
  const settings = await api("GET", "/frontend/settings").catch(() => null);
  const formats = (settings && settings.filesTranslation && settings.supportedFilesFormat) || [];
  state.files = settings;
  $("files").hidden = !formats.length || $("languages").hidden;
  $("file").accept = formats.join(",");
  $("file-formats").textContent = formats.join(" ");
}

// The file chosen, sent as LibreTranslate's form (file, source, target, api_key): a link to its
// translation, or the server's one-line error. Its language must be named: the server does not
// detect a file's (it refuses auto), and taking a language for it would translate from a guess.
async function onTranslateFile(event) {
  event.preventDefault();
  const file = $("file").files[0];
  if (!file) return showFileError("Choose a file to translate.");
  const { source, target } = chosenPair();
  if (source === "auto") {
    return showFileError("Choose the file's language in From: a file's language is not detected.");
  }
  const form = new FormData();
  form.append("file", file);
  form.append("source", source);
  form.append("target", target);
  const key = $("api-key").value.trim();
  if (key) form.append("api_key", key);
  setFileBusy(true);
  try {
    const response = await fetch("/translate_file", { method: "POST", body: form });
    const data = await response.json().catch(() => null);
    if (!response.ok) throw Object.assign(new Error(errorText(data, response)), { status: response.status });
    showFileLink(data.translatedFileUrl);
    setFileBusy(false, "ready");
  } catch (err) {
    showFileError(err.message);
    const keyed = state.files && state.files.keyRequired; // a key missing: a 400, as LibreTranslate's
    if (err.status === 403 || (keyed && !key)) $("api-key").closest("details").open = true;
  }
}

// The link to the translated file, named as the server saves it (URL: /download_file/TOKEN.NAME).
function showFileLink(url) {
  const last = new URL(url, location.href).pathname.split("/").pop();
  let name;
  try {
    name = decodeURIComponent(last.slice(last.indexOf(".") + 1));
  } catch {
    name = $("file").files[0].name;
  }
  $("file-link").href = url;
  $("file-link").download = name;
  $("file-link").textContent = name;
  $("file-result").hidden = false;
}

// As setBusy, for the file part: body[data-state] is "busy", then "ready" or "error".
function setFileBusy(busy, done) {
  document.body.dataset.state = busy ? "busy" : done;
  $("file-busy").hidden = !busy;
  $("translate-file").disabled = busy;
  if (busy) {
    $("file-error").hidden = true;
    $("file-result").hidden = true;
  }
}

function showFileError(message) {
  $("file-error").textContent = message;
  $("file-error").hidden = false;
  $("file-result").hidden = true;
  setFileBusy(false, "error");
}

// --- the form -----------------------------------------------------------------------------------

// A number when the field holds one, else its text as typed: the server then says what is wrong.
function fieldValue(id) {
  const text = $(id).value.trim();
  const number = Number(text);
  return text !== "" && Number.isFinite(number) ? number : text;
}

// The glossary box's pairs: "source<TAB>target" (two columns pasted from a sheet) or
// "source = target" a line; blank lines and lines starting with # are skipped.
function glossaryPairs() {
  const pairs = [];
  $("glossary").value.split("\n").forEach((line, n) => {
    if (!line.trim() || line.trim().startsWith("#")) return;
    const terms = line.includes("\t") ? line.split("\t") : line.split(" = ");
    if (terms.length !== 2 || !terms[0].trim() || !terms[1].trim()) {
      throw new Error(`glossary, line ${n + 1}: write "source<TAB>target" or "source = target"`);
    }
    pairs.push([terms[0].trim(), terms[1].trim()]);
  });
  return pairs;
}

// The document translated with scores (each word's probability); with an n-best list of more than
// one, a second request (scores are for the best translation only) gives the list.
async function onSubmit(event) {
  event.preventDefault();
  const text = $("source").value;
  if (!text.trim()) return showError("Type a sentence to translate.");
  let glossary;
  try {
    glossary = glossaryPairs();
  } catch (err) {
    return showError(err.message);
  }
  state.pair = chosenPair();
  state.options = { ...state.pair, beam: fieldValue("beam"), alpha: fieldValue("alpha") };
  if (glossary.length) state.options.glossary = glossary;
  const nbest = fieldValue("nbest");
  setBusy(true);
  try {
    const body = { text: [text], ...state.options };
    const [scored, listed] = await Promise.all([
      api("POST", "/v1/translate", { ...body, scores: true }),
      nbest === 1 ? null : api("POST", "/v1/translate", { ...body, nbest }),
    ]);
    const result = scored.translations[0];
    if (scored.detected) { // the sentences' attention and choices: of the language detected
      state.pair.source = scored.detected.language;
      state.options.source = scored.detected.language;
    }
    showTranslation(result, listed ? listed.translations[0].nbest : result.nbest);
    $("route").textContent = routeText(scored);
    $("route").hidden = !$("route").textContent;
    showSentences(result.sentences || []);
    if (state.sentences.length) await attend(0);
    setBusy(false, "ready");
    if (state.several) loadModel(state.pair); // describe the model of the pair translated
  } catch (err) {
    showError(err.message);
    if (err.status === 401) $("api-key").closest("details").open = true; // the key is missing or wrong
  }
}

// The attention of the document's sentence `index` (its source, searched with the same options from
// the prefix its translation came from); it becomes the sentence to edit.
async function attend(index) {
  const [source, target] = state.sentences[index];
  selectSentence(index);
  $("attention-sentence").textContent = source;
  const found = await api("POST", "/v1/attention", attentionBody(index, state.prefixes[index] || ""));
  if (state.selected !== index) return; // another sentence was chosen meanwhile
  showAttention(found);
  $("edit").value = target;
}

function attentionBody(index, prefix) {
  const body = { text: state.sentences[index][0], ...state.options };
  return prefix ? { ...body, prefix } : body;
}

function selectSentence(index) {
  state.selected = index;
  for (const pair of $("sentences").children) {
    pair.classList.toggle("selected", pair.dataset.index === String(index));
  }
  $("edit-source").textContent = state.sentences[index][0];
}

async function onChooseSentence(index) {
  setBusy(true);
  try {
    await attend(index);
    setBusy(false, "ready");
  } catch (err) {
    showError(err.message, true);
  }
}

// body[data-state] is "busy", "ready" or "error": what a reader (or a test) can wait for.
function setBusy(busy, done) {
  document.body.dataset.state = busy ? "busy" : done;
  $("busy").hidden = !busy;
  $("translate").disabled = busy;
  $("continue").disabled = busy;
  for (const button of document.querySelectorAll("button.choice")) {
    button.disabled = busy || Boolean(button.dataset.end); // the end of the sentence is never taken
  }
  if (busy) $("error").hidden = true;
}

// The server's one-line error; the results stay when only a sentence's attention failed.
function showError(message, keepResults = false) {
  $("error").textContent = message;
  $("error").hidden = false;
  if (!keepResults) $("results").hidden = true;
  setBusy(false, "error");
}

// --- translation and n-best list ----------------------------------------------------------------------

function showTranslation(result, nbest) {
  const pairs = result.sentences || [];
  const scores = result.sentence_scores || [];
  state.words = pairs.map((_, k) => (scores[k] ? scores[k].words : []));
  state.prefixes = pairs.map(() => "");
  state.text = result.text;
  state.layout = documentLayout(result.text, pairs.map(([, target]) => target));
  state.sentences = pairs.map((pair) => [...pair]);
  renderTranslation();
  $("choices").hidden = true;
  $("changed").hidden = true;
  $("score").textContent = formatScore(result.score);
  const confidence = result.confidence;
  $("confidence").textContent = confidence ? confidence.probability.toFixed(3) : "—";
  $("nbest-list").replaceChildren(...(nbest || []).map(nbestItem));
}

// The document's text around its sentences' translations: before[k], the text between sentence
// k - 1's last word and sentence k's first, and after, the text after the last; null where the
// document's words are not its sentences' (then it is shown as plain text).
function documentLayout(text, targets) {
  const counts = targets.map((target) => words(target).length);
  if (words(text).length !== counts.reduce((a, b) => a + b, 0)) return null;
  const layout = { before: counts.map(() => ""), after: "" };
  let k = 0, used = 0;
  const advance = () => {
    while (k < counts.length && used === counts[k]) [k, used] = [k + 1, 0];
  };
  advance();
  for (const token of tokens(text)) {
    if (/\S/.test(token)) {
      used += 1;
      advance();
    } else if (k >= counts.length) {
      layout.after += token;
    } else if (used === 0) {
      layout.before[k] += token;
    } // else: a space between the words of sentence k, which its own text holds
  }
  return layout;
}

const tokens = (text) => text.match(/\s+|\S+/g) || [];
const words = (text) => tokens(text).filter((token) => /\S/.test(token));

// The document with each word of each sentence a span on its probability's colour.
function renderTranslation() {
  if (!state.layout) {
    $("translation").textContent = state.text;
    return;
  }
  const nodes = [];
  state.sentences.forEach(([, target], k) => {
    nodes.push(state.layout.before[k]);
    let j = 0;
    for (const token of tokens(target)) nodes.push(/\S/.test(token) ? wordSpan(token, k, j++) : token);
  });
  nodes.push(state.layout.after);
  $("translation").replaceChildren(...nodes);
}

function wordSpan(word, k, j) {
  const span = document.createElement("span");
  span.className = "word";
  span.textContent = word;
  Object.assign(span.dataset, { sentence: k, word: j });
  span.tabIndex = 0;
  const scored = (state.words[k] || [])[j];
  if (scored && typeof scored[1] === "number") {
    span.dataset.probability = scored[1];
    span.title = `probability ${scored[1].toFixed(3)}`;
    span.style.backgroundColor = colourAt(CONFIDENCE, scored[1]);
  }
  span.addEventListener("click", () => onChooseWord(k, j));
  span.addEventListener("keydown", (e) => { if (e.key === "Enter") onChooseWord(k, j); });
  return span;
}

function nbestItem(hypothesis) {
  const item = document.createElement("li");
  const score = document.createElement("span");
  score.className = "score";
  score.textContent = formatScore(hypothesis.score);
  item.append(score, " ", hypothesis.text);
  return item;
}

// A score, or a dash where the engine gives none (null).
const formatScore = (score) => (typeof score === "number" ? score.toFixed(3) : "—");

// --- the model's other choices, and decoding the rest again ----------------------------------------

// The text of a translation before its word `j` (spaces kept, trailing ones dropped).
function textBefore(text, j) {
  let seen = 0, out = "";
  for (const token of tokens(text)) {
    if (/\S/.test(token) && seen++ === j) break;
    out += token;
  }
  return out.trim();
}

// Word `j` of sentence `k` clicked: the model's CHOICES most probable pieces there, given the words
// before it; the sentence becomes the one chosen (its attention drawn, its text to edit).
async function onChooseWord(k, j) {
  setBusy(true);
  try {
    const [source, target] = state.sentences[k];
    const prefix = textBefore(target, j);
    const [found] = await Promise.all([
      api("POST", "/v1/choices", { text: source, prefix, k: CHOICES, ...state.pair }),
      state.selected === k ? null : attend(k),
    ]);
    showChoices(k, j, prefix, found);
    setBusy(false, "ready");
  } catch (err) {
    showError(err.message, true);
  }
}

function showChoices(k, j, prefix, found) {
  for (const span of $("translation").querySelectorAll(".word")) {
    span.classList.toggle("chosen", span.dataset.sentence === String(k) && span.dataset.word === String(j));
  }
  $("choices-prefix").textContent = prefix || "(the start)";
  $("choices-list").replaceChildren(...found.choices.map((choice) => choiceItem(k, choice)));
  $("choices-rest").textContent = percent(found.rest);
  $("choices").hidden = false;
}

// A choice: its text (… where it continues the word before), its probability; taking it decodes the
// rest of the sentence from its prefix. The end of the sentence is shown, not taken.
function choiceItem(k, choice) {
  const item = document.createElement("li");
  const button = document.createElement("button");
  button.type = "button";
  button.className = "choice";
  button.dataset.prefix = choice.prefix;
  const text = choice.text.startsWith(" ") ? choice.text.trim() : `…${choice.text}`;
  button.textContent = choice.end ? "(end of the sentence)" : text;
  button.title = `piece ${choice.piece}, probability ${choice.probability.toFixed(3)}`;
  if (choice.end) {
    button.dataset.end = "true";
    button.disabled = true;
  } else {
    button.addEventListener("click", () => continueFrom(k, choice.prefix));
  }
  const probability = document.createElement("span");
  probability.className = "probability";
  probability.textContent = percent(choice.probability);
  item.append(probability, " ", button);
  return item;
}

const percent = (p) => `${(100 * p).toFixed(1)} %`;

// Sentence `k` decoded again from `prefix` (/v1/attention: the translation, its words' probabilities
// and what the model attends to); the document, the sentence pairs and the views follow.
async function continueFrom(k, prefix) {
  setBusy(true);
  try {
    selectSentence(k);
    const found = await api("POST", "/v1/attention", attentionBody(k, prefix));
    state.prefixes[k] = prefix;
    state.sentences[k] = [state.sentences[k][0], found.translation];
    state.words[k] = found.words;
    renderTranslation();
    showSentences(state.sentences);
    selectSentence(k);
    $("attention-sentence").textContent = state.sentences[k][0];
    showAttention(found);
    $("edit").value = found.translation;
    $("choices").hidden = true;
    $("changed").hidden = false;
    setBusy(false, "ready");
  } catch (err) {
    showError(err.message, true);
  }
}

// "Continue from the cursor": the edited text before the cursor is the prefix (one line).
function onContinue() {
  const edit = $("edit");
  const prefix = edit.value.slice(0, edit.selectionStart).replace(/[\r\n]+/g, " ");
  if (state.sentences.length) continueFrom(state.selected, prefix);
}

// --- sentence by sentence -----------------------------------------------------------------------

// One row per sentence: the source on the left, its translation on the right.
function showSentences(pairs) {
  state.sentences = pairs;
  $("sentences").replaceChildren(...pairs.map(([source, target], index) => {
    const row = document.createElement("li");
    row.className = "pair";
    row.dataset.index = index;
    row.tabIndex = 0;
    row.append(sentenceCell(source, "src", index), sentenceCell(target, "tgt", index));
    row.addEventListener("click", () => onChooseSentence(index));
    row.addEventListener("keydown", (e) => { if (e.key === "Enter") onChooseSentence(index); });
    return row;
  }));
}

// Hovering a sentence highlights it and its pair (class "active" on both).
function sentenceCell(text, side, index) {
  const cell = document.createElement("span");
  cell.className = `sentence ${side}`;
  cell.dataset.side = side;
  cell.textContent = text;
  cell.addEventListener("mouseenter", () => highlightPair(index, true));
  cell.addEventListener("mouseleave", () => highlightPair(index, false));
  return cell;
}

function highlightPair(index, on) {
  for (const row of $("sentences").children) {
    const mine = on && row.dataset.index === String(index);
    for (const cell of row.children) cell.classList.toggle("active", mine);
  }
}

// --- cross-attention as lines between the pieces ---------------------------------------------------

function showAttention(data) {
  state.attention = data;
  $("results").hidden = false; // visible first, so that the SVG has its width
  fillSelectors(data.attention.cross);
  showBridge(data);
  drawAlignment();
  drawHeatmaps(data);
}

// Over a pivot the attention is the last model's, reading the sentence the models before it made
// (the answer's bridge: the sentence in the last bridge language); it is said above the view.
function showBridge(data) {
  const bridge = data.bridge || [], last = (data.route || []).at(-1);
  $("bridge").hidden = !bridge.length || !last;
  if ($("bridge").hidden) return;
  $("bridge-step").textContent = `${last.source} → ${last.target} (model ${last.model})`;
  $("bridge-sentence").textContent = bridge.at(-1);
}

// Layers 1..L; heads: "all heads (average)" and 1..H. The choice is kept across sentences.
function fillSelectors(cross) {
  const layer = $("layer").value || String(cross.length - 1), head = $("head").value || "all";
  $("layer").replaceChildren(...cross.map((_, i) => new Option(`${i + 1}`, String(i))));
  const heads = cross[0].map((_, h) => new Option(`${h + 1}`, String(h)));
  $("head").replaceChildren(new Option("all heads (average)", "all"), ...heads);
  $("layer").value = Number(layer) < cross.length ? layer : String(cross.length - 1);
  $("head").value = head === "all" || Number(head) < heads.length ? head : "all";
}

// The (target x source) weights of the chosen layer and head, or the mean of its heads.
function chosenWeights() {
  const heads = state.attention.attention.cross[Number($("layer").value)];
  const head = $("head").value;
  if (head !== "all") return heads[Number(head)];
  const mean = (t, s) => heads.reduce((sum, h) => sum + h[t][s], 0) / heads.length;
  return heads[0].map((row, t) => row.map((_, s) => mean(t, s)));
}

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes)) element.setAttribute(key, value);
  if (text !== undefined) element.textContent = text;
  return element;
}

// The label of each target position as a query: the piece it predicts (the default, as an
// alignment is read: "kleiner" -> "small") or the piece the decoder reads there (<s> first).
function targetRows() {
  const { predicted_pieces: predicted, target_pieces: read } = state.attention;
  return $("target-rows").value === "reads" || !predicted ? read : predicted;
}

// Source pieces in the left column, target pieces in the right one, a line per weight >= 0.02.
function drawAlignment() {
  const src = state.attention.source_pieces, tgt = targetRows();
  const svg = $("alignment"), rowHeight = 24, column = 130;
  const width = Math.max(svg.parentElement.clientWidth - 32, 2 * column + 120);
  const height = Math.max(src.length, tgt.length) * rowHeight + 12;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("width", width);
  svg.setAttribute("height", height);
  const y = (i) => 18 + i * rowHeight;
  const colour = $("head").value === "all" ? AVERAGE_COLOUR : HEAD_COLOURS[Number($("head").value) % 10];
  const links = svgElement("g", { class: "links" });
  chosenWeights().forEach((row, t) => row.forEach((w, s) => {
    if (w < 0.02) return;
    links.append(svgElement("line", {
      x1: column + 8, y1: y(s) - 4, x2: width - column - 8, y2: y(t) - 4, stroke: colour,
      "stroke-opacity": Math.min(1, 0.15 + w).toFixed(3), "stroke-width": (0.5 + 5 * w).toFixed(2),
      "data-src": s, "data-tgt": t,
    }, undefined));
  }));
  const pieces = [...src.map((p, i) => pieceLabel(p, "src", i, column, y(i), "end")),
    ...tgt.map((p, i) => pieceLabel(p, "tgt", i, width - column, y(i), "start"))];
  svg.replaceChildren(links, ...pieces);
}

function pieceLabel(piece, side, index, x, y, anchor) {
  const label = svgElement("text", { x, y, "text-anchor": anchor, class: "piece", "data-side": side,
    "data-index": index, tabindex: 0 }, piece);
  label.addEventListener("mouseenter", () => focusPiece(side, index, true));
  label.addEventListener("mouseleave", () => focusPiece(side, index, false));
  label.addEventListener("focus", () => focusPiece(side, index, true));
  label.addEventListener("blur", () => focusPiece(side, index, false));
  return label;
}

// Hovering a piece highlights its links (class "active"), dims every other line, and marks the
// pieces at the other ends of its links ("linked").
function focusPiece(side, index, on) {
  const svg = $("alignment"), other = side === "src" ? "tgt" : "src";
  const linked = new Set();
  svg.classList.toggle("focus", on);
  for (const line of svg.querySelectorAll("line")) {
    const active = on && line.dataset[side] === String(index);
    line.classList.toggle("active", active);
    if (active) linked.add(line.dataset[other]);
  }
  for (const text of svg.querySelectorAll("text")) {
    const mine = text.dataset.side === side && text.dataset.index === String(index);
    text.classList.toggle("active", on && mine);
    text.classList.toggle("linked", text.dataset.side === other && linked.has(text.dataset.index));
  }
}

// --- heatmaps of every layer and head --------------------------------------------------------------

// One section per kind, one row per layer, one canvas per head: the demo's attention.png. Target
// rows (queries) are labelled as targetRows() says; target columns (keys) by the pieces read.
function drawHeatmaps(data) {
  const rows = { source: data.source_pieces, target: targetRows() };
  const cols = { source: data.source_pieces, target: data.target_pieces };
  const sections = Object.entries(KINDS).map(([kind, [title, queries, keys]]) => {
    const section = document.createElement("section");
    section.className = "kind";
    const heading = document.createElement("h3");
    heading.textContent = `${title}: ${queries} × ${keys}`;
    section.append(heading);
    (data.attention[kind] || []).forEach((heads, layer) => {
      section.append(layerRow(kind, layer, heads, rows[queries], cols[keys]));
    });
    return section;
  });
  $("heatmaps").replaceChildren(...sections);
}

function layerRow(kind, layer, heads, rows, cols) {
  const row = document.createElement("div");
  row.className = "layer-row";
  heads.forEach((matrix, head) => {
    const figure = document.createElement("figure");
    const caption = document.createElement("figcaption");
    caption.textContent = `layer ${layer + 1}, head ${head + 1}`;
    figure.append(heatmap(matrix, rows, cols, { kind, layer, head }), caption);
    row.append(figure);
  });
  return row;
}

// A canvas with the weights as cells (viridis, 0..1) and the pieces along the axes.
function heatmap(matrix, rows, cols, where) {
  const canvas = document.createElement("canvas");
  canvas.className = "heatmap";
  Object.assign(canvas.dataset, where);
  const title = `${KINDS[where.kind][0]}, layer ${where.layer + 1}, head ${where.head + 1}`;
  canvas.setAttribute("aria-label", title);
  canvas.dataset.rows = JSON.stringify(rows); // the row labels drawn, for a reader's tools (and tests)
  const box = heatmapBox(canvas.getContext("2d"), rows, cols);
  canvas.width = box.left + cols.length * box.cell + 2;
  canvas.height = box.top + rows.length * box.cell + 2;
  drawCells(canvas.getContext("2d"), matrix, box);
  if (box.font) drawAxisLabels(canvas.getContext("2d"), rows, cols, box);
  canvas.addEventListener("mousemove", (e) => cellTooltip(e, matrix, rows, cols, box));
  canvas.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
  if (where.kind === "cross") canvas.addEventListener("click", () => showInAlignment(where));
  return canvas;
}

// Cells of 4..18 px (about 200 px a side); labels, when the cells are big enough to read them,
// take the room of the longest piece: query pieces on the left, key pieces on top.
function heatmapBox(ctx, rows, cols) {
  const cell = Math.max(4, Math.min(18, Math.floor(200 / Math.max(rows.length, cols.length))));
  const font = cell >= 8 ? `${Math.min(11, cell - 2)}px sans-serif` : null;
  ctx.font = font || ctx.font;
  const widest = (pieces) => Math.ceil(Math.max(...pieces.map((p) => ctx.measureText(p).width)));
  const room = (pieces) => (font ? widest(pieces) + 6 : 2);
  return { cell, font, left: room(rows), top: room(cols) };
}

function drawCells(ctx, matrix, box) {
  matrix.forEach((row, q) => row.forEach((w, k) => {
    ctx.fillStyle = colourAt(VIRIDIS, w);
    ctx.fillRect(box.left + k * box.cell, box.top + q * box.cell, box.cell, box.cell);
  }));
}

// Query pieces on the left, key pieces along the top (written downwards).
function drawAxisLabels(ctx, rows, cols, box) {
  ctx.font = box.font;
  ctx.fillStyle = "#222";
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  rows.forEach((p, q) => ctx.fillText(p, box.left - 4, box.top + (q + 0.5) * box.cell));
  cols.forEach((p, k) => {
    ctx.save();
    ctx.translate(box.left + (k + 0.5) * box.cell, box.top - 4);
    ctx.rotate(Math.PI / 2);
    ctx.fillText(p, 0, 0);
    ctx.restore();
  });
}

// "query → key: weight" beside the pointer, over a cell.
function cellTooltip(event, matrix, rows, cols, box) {
  const q = Math.floor((event.offsetY - box.top) / box.cell);
  const k = Math.floor((event.offsetX - box.left) / box.cell);
  const tooltip = $("tooltip");
  tooltip.hidden = !(q >= 0 && k >= 0 && q < rows.length && k < cols.length);
  if (tooltip.hidden) return;
  tooltip.textContent = `${rows[q]} → ${cols[k]}: ${matrix[q][k].toFixed(3)}`;
  tooltip.style.left = `${event.clientX + 14}px`;
  tooltip.style.top = `${event.clientY + 14}px`;
}

// Clicking a cross-attention heatmap shows its layer and head as lines.
function showInAlignment(where) {
  $("layer").value = String(where.layer);
  $("head").value = String(where.head);
  drawAlignment();
  $("alignment").scrollIntoView({ behavior: "smooth", block: "center" });
}

// --- colours ------------------------------------------------------------------------------------

// The colour at t in [0, 1] of a map given as evenly spaced stops, linearly interpolated.
function colourAt(stops, t) {
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(Math.floor(x), stops.length - 2), f = x - i;
  const [a, b] = [rgb(stops[i]), rgb(stops[i + 1])];
  return `rgb(${a.map((v, j) => Math.round(v + f * (b[j] - v))).join(",")})`;
}

function rgb(hex) {
  return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
}

// --- the positional encoding --------------------------------------------------------------------------

// The paper's table: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).
function positionalEncoding(maxLen, d) {
  return Array.from({ length: maxLen }, (_, pos) => Array.from({ length: d }, (_, j) => {
    const angle = pos / Math.pow(10000, (j - (j % 2)) / d);
    return j % 2 === 0 ? Math.sin(angle) : Math.cos(angle);
  }));
}

// The table as a heatmap (position down, dimension across) with a colour bar, as plots.py draws it.
function drawPositionalEncoding(d, maxLen) {
  const table = positionalEncoding(maxLen, d);
  const canvas = $("pe"), ctx = canvas.getContext("2d");
  const box = { x: 52, y: 28, w: canvas.width - 130, h: canvas.height - 70 };
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const [cw, ch] = [box.w / d, box.h / maxLen];
  table.forEach((row, pos) => row.forEach((v, j) => {
    ctx.fillStyle = colourAt(RDBU, (v + 1) / 2);
    ctx.fillRect(box.x + j * cw, box.y + pos * ch, cw + 0.5, ch + 0.5);
  }));
  axes(ctx, box, `Sinusoidal positional encoding (d_model=${d})`, "dimension i", "position");
  ticks(ctx, box, quarters(d), quarters(maxLen));
  colourBar(ctx, box.x + box.w + 24, box.y, box.h);
  drawPeLines(table, d);
}

function axes(ctx, box, title, xLabel, yLabel) {
  ctx.fillStyle = "#222";
  ctx.font = "13px sans-serif";
  ctx.textAlign = "center";
  ctx.fillText(title, box.x + box.w / 2, 18);
  ctx.font = "11px sans-serif";
  ctx.fillText(xLabel, box.x + box.w / 2, box.y + box.h + 32);
  ctx.save();
  ctx.translate(14, box.y + box.h / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.fillText(yLabel, 0, 0);
  ctx.restore();
}

// Tick labels evenly spaced along each axis: xs left to right, ys top to bottom.
function ticks(ctx, box, xs, ys) {
  ctx.font = "10px sans-serif";
  ctx.fillStyle = "#222";
  ctx.textAlign = "center";
  xs.forEach((text, n) => ctx.fillText(text, box.x + (n / (xs.length - 1)) * box.w, box.y + box.h + 14));
  ctx.textAlign = "right";
  ys.forEach((text, n) => ctx.fillText(text, box.x - 4, box.y + (n / (ys.length - 1)) * box.h + 3));
}

// Five labels from 0 to n: 0, n/4, n/2, 3n/4, n.
const quarters = (n) => [0, 0.25, 0.5, 0.75, 1].map((f) => String(Math.round(f * n)));

function colourBar(ctx, x, y, h) {
  for (let i = 0; i < h; i++) {
    ctx.fillStyle = colourAt(RDBU, 1 - i / h);
    ctx.fillRect(x, y + i, 14, 1);
  }
  ctx.fillStyle = "#222";
  ctx.textAlign = "left";
  [["+1", 0], ["0", 0.5], ["−1", 1]].forEach(([text, f]) => ctx.fillText(text, x + 18, y + f * h + 4));
}

// A few dimensions along the positions (as plots.py: sines at 1/64, 1/16, 1/8 and 1/4 of d_model).
function drawPeLines(table, d) {
  const canvas = $("pe-lines"), ctx = canvas.getContext("2d");
  const box = { x: 52, y: 28, w: canvas.width - 180, h: canvas.height - 66 };
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  ctx.strokeStyle = "#bbb";
  ctx.strokeRect(box.x, box.y, box.w, box.h);
  const dims = [...new Set([1 / 64, 1 / 16, 1 / 8, 1 / 4].map((f) => 2 * Math.floor((d * f) / 2)))];
  dims.forEach((j, n) => {
    ctx.strokeStyle = HEAD_COLOURS[n];
    ctx.beginPath();
    table.forEach((row, pos) => {
      const [px, py] = [box.x + (pos / (table.length - 1 || 1)) * box.w, box.y + ((1 - row[j]) / 2) * box.h];
      if (pos === 0) ctx.moveTo(px, py); else ctx.lineTo(px, py);
    });
    ctx.stroke();
    ctx.fillStyle = HEAD_COLOURS[n];
    ctx.textAlign = "left";
    ctx.fillText(`dim ${j} (${j % 2 ? "cos" : "sin"})`, box.x + box.w + 12, box.y + 12 + 16 * n);
  });
  axes(ctx, box, "a few dimensions along the positions", "position", "value");
  ticks(ctx, box, quarters(table.length), ["1", "0", "−1"]);
}

// --- start --------------------------------------------------------------------------------------

function start() {
  const key = $("api-key");
  key.value = sessionStorage.getItem("aiayn-api-key") || "";
  if (key.value) key.closest("details").open = true;
  key.addEventListener("input", () => sessionStorage.setItem("aiayn-api-key", key.value.trim()));
  key.addEventListener("change", () => loadModel());
  $("source-lang").addEventListener("change", fillTargets);
  $("translate-form").addEventListener("submit", onSubmit);
  $("file-form").addEventListener("submit", onTranslateFile);
  $("continue").addEventListener("click", onContinue);
  $("choices-close").addEventListener("click", () => {
    $("choices").hidden = true;
    for (const span of $("translation").querySelectorAll(".word.chosen")) span.classList.remove("chosen");
  });
  $("source").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) $("translate-form").requestSubmit();
  });
  $("layer").addEventListener("change", drawAlignment);
  $("head").addEventListener("change", drawAlignment);
  $("target-rows").addEventListener("change", () => {
    if (!state.attention) return;
    drawAlignment();
    drawHeatmaps(state.attention);
  });
  window.addEventListener("resize", () => state.attention && drawAlignment());
  drawPositionalEncoding(512, 100); // until the model says its d_model
  loadLanguages().then(loadFiles); // the file part needs the pickers
  loadModel();
}

start();
