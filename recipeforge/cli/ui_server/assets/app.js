// recipeforge ui: the runs page (live charts) and the recipe editor. Every value from the server is put on
// the page as text (textContent), never as HTML.
"use strict";

const TOKEN = document.querySelector('meta[name="recipeforge-token"]').content;
const $ = (id) => document.getElementById(id);

async function api(path, body) {
  const options = {headers: {"X-RecipeForge-Token": TOKEN}};
  if (body !== undefined) {
    options.method = "POST";
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, options);
  } catch (e) {
    return {error: {message: "the server does not answer (" + e + ")"}};
  }
  try {
    return await response.json();
  } catch (e) {
    return {error: {message: "HTTP " + response.status}};
  }
}

function node(tag, text, className) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (className) e.className = className;
  return e;
}

function describe(error) {
  const parts = [];
  if (error.location) parts.push(error.location);
  if (error.key) parts.push(error.key + ":");
  parts.push(error.message);
  return parts.join(" ") + (error.hint ? " (hint: " + error.hint + ")" : "");
}

function notice(text) {
  $("notice").textContent = text || "";
}

// ---- tabs ----------------------------------------------------------------------------------------------
for (const button of document.querySelectorAll(".tab")) {
  button.addEventListener("click", () => showTab(button.dataset.tab));
}

function showTab(name) {
  for (const b of document.querySelectorAll(".tab")) b.classList.toggle("active", b.dataset.tab === name);
  $("runs").hidden = name !== "runs";
  $("editor").hidden = name !== "editor";
}

// ---- runs ----------------------------------------------------------------------------------------------
let selected = null;
let since = 0;
let charts = {};

const CHARTS = {
  "chart-loss": {title: "Loss", series: (row) => {
    const out = [];
    if (row.split === "train" && typeof row.loss === "number") out.push(["train loss", row.loss]);
    if (row.split === "eval" && typeof row.eval_loss === "number") out.push(["eval loss", row.eval_loss]);
    return out;
  }},
  "chart-lr": {title: "Learning rate", series: (row) =>
    row.split === "train" && typeof row.learning_rate === "number" ? [["learning rate", row.learning_rate]] : []},
  "chart-reward": {title: "Reward (mean)", series: (row) => {
    if (row.split !== "train") return [];
    const out = [];
    if (typeof row.reward === "number") out.push(["reward", row.reward]);
    for (const [key, value] of Object.entries(row)) {
      const m = /^rewards\/(.+)\/mean$/.exec(key);
      if (m && typeof value === "number") out.push([m[1], value]);
    }
    return out;
  }},
};
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

function makeCharts() {
  for (const chart of Object.values(charts)) chart.destroy();
  charts = {};
  for (const [id, spec] of Object.entries(CHARTS)) {
    const box = $(id);
    box.dataset.points = "0";
    box.hidden = true;
    charts[id] = new Chart(box.querySelector("canvas"), {
      type: "line",
      data: {datasets: []},
      options: {
        animation: false, responsive: true, maintainAspectRatio: false,
        plugins: {title: {display: true, text: spec.title}},
        scales: {x: {type: "linear", title: {display: true, text: "step"}}},
        elements: {point: {radius: 2}},
      },
    });
  }
}

function addRows(rows) {
  for (const [id, spec] of Object.entries(CHARTS)) {
    const chart = charts[id];
    let added = false;
    for (const row of rows) {
      for (const [label, value] of spec.series(row)) {
        let set = chart.data.datasets.find((d) => d.label === label);
        if (!set) {
          const color = COLORS[chart.data.datasets.length % COLORS.length];
          set = {label: label, data: [], borderColor: color, backgroundColor: color, showLine: true};
          chart.data.datasets.push(set);
        }
        set.data.push({x: row.step, y: value});
        added = true;
      }
    }
    if (added) {
      const box = $(id);
      box.hidden = false;
      box.dataset.points = String(chart.data.datasets.reduce((n, d) => n + d.data.length, 0));
      chart.update("none");
    }
  }
}

async function refreshRuns() {
  const data = await api("/api/runs");
  if (data.error) { notice(describe(data.error)); return; }
  $("runs-dir").textContent = data.runs_dir;
  const body = $("runs-table").querySelector("tbody");
  body.replaceChildren();
  for (const run of data.runs) {
    const tr = node("tr");
    tr.dataset.run = run.name;
    if (run.name === selected) tr.classList.add("selected");
    tr.append(node("td", run.name), node("td", run.stage || ""), node("td", run.state, "state " + run.state),
              node("td", run.last_step ?? ""), node("td", typeof run.last_loss === "number" ? run.last_loss.toFixed(4) : ""));
    if (run.error) tr.title = run.error;
    tr.addEventListener("click", () => selectRun(run.name));
    body.append(tr);
  }
  for (const id of ["diff-a", "diff-b"]) {
    const select = $(id);
    const keep = select.value;
    select.replaceChildren(...data.runs.map((r) => { const o = node("option", r.name); o.value = r.name; return o; }));
    if (keep) select.value = keep;
    else if (id === "diff-b" && data.runs.length > 1) select.value = data.runs[1].name;
  }
}

async function selectRun(name) {
  selected = name;
  since = 0;
  $("run-detail").hidden = false;
  $("run-name").textContent = name;
  for (const tr of document.querySelectorAll("#runs-table tbody tr")) tr.classList.toggle("selected", tr.dataset.run === name);
  makeCharts();
  await refreshDetail();
  await pollMetrics();
}

async function refreshDetail() {
  if (!selected) return;
  const name = selected;
  const data = await api("/api/run?name=" + encodeURIComponent(name));
  if (name !== selected) return;
  if (data.error) { $("run-state").textContent = "unreadable"; $("run-progress").textContent = describe(data.error); return; }
  const status = data.status;
  $("run-state").textContent = status.state;
  $("run-state").className = "state " + status.state;
  const loss = typeof status.last_loss === "number" ? ", loss " + status.last_loss.toFixed(4) : "";
  $("run-progress").textContent = (status.last_step !== null ? "step " + status.last_step + loss : "no step logged yet") +
    (status.checkpoints.length ? "; checkpoints: " + status.checkpoints.join(", ") : "") +
    (status.resumable ? " (resumable: train the same recipe into this folder again)" : "");
  $("stop").hidden = !(data.started_here && status.state === "running");
  $("run-plan").textContent = data.plan ? planText(data.plan) : "(no plan.json)";
  $("run-recipe").textContent = data.resolved_recipe || "(no resolved_recipe.yaml)";
  const evalBox = $("run-eval");
  evalBox.replaceChildren();
  const scores = data.report && !data.report.error ? data.report.eval || {} : {};
  if (Object.keys(scores).length === 0) evalBox.textContent = "(no eval results: recipeforge eval RUN_DIR writes them)";
  for (const [task, values] of Object.entries(scores)) {
    evalBox.append(node("div", task + ": " + JSON.stringify(values)));
  }
  if (data.started_here) {
    const log = await api("/api/log?name=" + encodeURIComponent(name));
    if (!log.error) $("run-log").textContent = log.text;
  }
}

function planText(plan) {
  const lines = [];
  for (const key of ["backend", "preset", "device", "nodes", "world_size", "micro_batch_size", "gradient_accumulation",
                     "global_batch_size", "data_parallel"]) {
    if (plan[key] !== undefined && plan[key] !== null) lines.push(key + ": " + JSON.stringify(plan[key]));
  }
  for (const [key, value] of Object.entries(plan)) {
    if (!lines.some((l) => l.startsWith(key + ":"))) lines.push(key + ": " + JSON.stringify(value));
  }
  return lines.join("\n");
}

async function pollMetrics() {
  if (!selected) return;
  const name = selected;
  const data = await api("/api/metrics?name=" + encodeURIComponent(name) + "&since=" + since);
  if (name !== selected || data.error) return;
  if (data.next < since) { since = 0; makeCharts(); return; }  // the run was started again from scratch
  since = data.next;
  addRows(data.rows);
}

$("diff-go").addEventListener("click", async () => {
  const data = await api("/api/diff?a=" + encodeURIComponent($("diff-a").value) + "&b=" + encodeURIComponent($("diff-b").value));
  if (data.error) { $("diff-out").textContent = describe(data.error); return; }
  const lines = data.equal ? ["(the two recipes are the same)"] : [...data.recipe, ...data.lock];
  $("diff-out").textContent = lines.map((l) => typeof l === "string" ? l : JSON.stringify(l)).join("\n");
});

$("stop").addEventListener("click", async () => {
  const data = await api("/api/stop", {name: selected});
  notice(data.error ? describe(data.error) : data.message);
});

// ---- editor --------------------------------------------------------------------------------------------
let recipe = null;       // the open recipe (relative to the recipes folder)
let savedText = "";
let checkSeq = 0;
let checkTimer = null;
let commandTimer = null;

async function loadRecipes() {
  const data = await api("/api/recipes");
  if (data.error) { notice(describe(data.error)); return; }
  $("recipe-select").replaceChildren(...data.recipes.map((r) => { const o = node("option", r); o.value = r; return o; }));
}

async function openRecipe(path) {
  const data = await api("/api/recipe?path=" + encodeURIComponent(path));
  if (data.error) { notice(describe(data.error)); return; }
  recipe = data.recipe;
  savedText = data.text;
  $("recipe-file").textContent = data.file;
  $("recipe-text").value = data.text;
  const chain = $("chain");
  chain.replaceChildren();
  for (const parent of data.chain) {
    const box = node("details");
    box.append(node("summary", "extends: " + parent.file + (parent.editable ? "" : " (read-only: outside the recipes folder)")),
               node("pre", parent.text, "box"));
    chain.append(box);
  }
  const stem = recipe.split("/").pop().replace(/\.ya?ml$/, "");
  if (!$("run-name-input").value) $("run-name-input").value = stem + "-ui";
  $("save-state").textContent = "";
  formStage = null;
  lastProblems = [];
  renderGutter([]);
  scheduleCheck(0);
  scheduleCommand();
}

function renderGutter(errorLines) {
  const count = $("recipe-text").value.split("\n").length;
  const gutter = $("gutter");
  gutter.replaceChildren();
  for (let i = 1; i <= count; i++) {
    const line = node("span", String(i), "ln");
    line.dataset.line = String(i);
    const errors = errorLines.filter((e) => e.line === i);
    if (errors.length) {
      line.classList.add("error");
      line.title = errors.map((e) => describe(e.error)).join("\n");
    }
    gutter.append(line, "\n");
  }
  gutter.scrollTop = $("recipe-text").scrollTop;
}

function scheduleCheck(delay) {
  clearTimeout(checkTimer);
  checkTimer = setTimeout(check, delay);
}

async function check() {
  if (!recipe) return;
  const seq = ++checkSeq;
  $("errors").replaceChildren(node("li", "checking...", "pending"));
  const data = await api("/api/check", {path: recipe, text: $("recipe-text").value, hardware: $("hardware").value,
                                         overrides: $("overrides").value});
  if (seq !== checkSeq) return;  // a later edit's check is under way
  const list = $("errors");
  list.replaceChildren();
  const located = [];
  const failure = data.error || (data.validate && data.validate.error);
  lastProblems = failure ? failure.problems || [failure] : data.plan && data.plan.error ? [data.plan.error] : [];
  if (failure) {
    for (const problem of failure.problems || [failure]) {
      const item = node("li", describe(problem), "error");
      if (typeof problem.line === "number") {  // in the edited file (the server says so)
        const line = problem.line;
        item.dataset.line = String(line);
        located.push({line: line, error: problem});
        item.addEventListener("click", () => goToLine(line));
      }
      if (problem.key) item.dataset.key = problem.key;
      list.append(item);
    }
    $("plan").textContent = "(no plan until the recipe is valid)";
  } else {
    list.append(node("li", "valid: " + data.validate.stage + " recipe, model " + data.validate.model + ", adapter " +
                           data.validate.adapter, "ok"));
    const plan = data.plan;
    $("plan").textContent = plan && plan.error ? "plan: " + describe(plan.error) : plan.text;
  }
  renderGutter(located);
  if (view === "form") await refreshForm(); else markFieldErrors();
}

function goToLine(line) {
  const area = $("recipe-text");
  const lines = area.value.split("\n");
  const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
  area.focus();
  area.setSelectionRange(start, start + (lines[line - 1] || "").length);
}

function scheduleCommand() {
  clearTimeout(commandTimer);
  commandTimer = setTimeout(showCommand, 250);
}

async function showCommand() {
  if (!recipe) return;
  const data = await api("/api/command", {path: recipe, name: $("run-name-input").value, overrides: $("overrides").value});
  $("command").textContent = data.error ? describe(data.error) : data.command_line;
}

async function save() {
  const text = $("recipe-text").value;
  const data = await api("/api/save", {path: recipe, text: text});
  if (data.error) { $("save-state").textContent = "not saved: " + describe(data.error); return false; }
  savedText = text;
  $("save-state").textContent = "saved";
  return true;
}

$("recipe-open").addEventListener("click", () => openRecipe($("recipe-select").value));
$("recipe-text").addEventListener("input", () => {
  renderGutter([]);
  $("save-state").textContent = $("recipe-text").value === savedText ? "" : "unsaved changes";
  scheduleCheck(300);
});
$("recipe-text").addEventListener("scroll", () => { $("gutter").scrollTop = $("recipe-text").scrollTop; });
$("hardware").addEventListener("input", () => scheduleCheck(300));
$("overrides").addEventListener("input", () => { scheduleCheck(300); scheduleCommand(); });
$("run-name-input").addEventListener("input", scheduleCommand);
$("save").addEventListener("click", save);
$("launch").addEventListener("click", async () => {
  if (!recipe) return;
  $("launch-state").textContent = "starting...";
  if ($("recipe-text").value !== savedText && !(await save())) { $("launch-state").textContent = "not started: the edit is not saved"; return; }
  const data = await api("/api/launch", {path: recipe, name: $("run-name-input").value, overrides: $("overrides").value});
  if (data.error) { $("launch-state").textContent = "not started: " + describe(data.error); return; }
  $("launch-state").textContent = "started (pid " + data.pid + "): " + data.command_line;
  $("command").textContent = data.command_line;
  showTab("runs");
  await refreshRuns();
  await selectRun(data.name);
});

// ---- the form view: fields from the recipe's JSON Schema; a change sets its key in the YAML text -----------
let view = "yaml";
let formStage = null;    // the stage whose fields are on the page
let formSeq = 0;
let lastProblems = [];   // the problems of the last check, shown at their fields too

for (const button of document.querySelectorAll(".view")) {
  button.addEventListener("click", () => showView(button.dataset.view));
}

function showView(name) {
  view = name;
  for (const b of document.querySelectorAll(".view")) b.classList.toggle("active", b.dataset.view === name);
  $("yaml-view").hidden = name !== "yaml";
  $("form-view").hidden = name !== "form";
  if (name === "form") refreshForm();
}

async function refreshForm() {
  if (!recipe) return;
  const seq = ++formSeq;
  const data = await api("/api/form", {path: recipe, text: $("recipe-text").value});
  if (seq !== formSeq) return;  // a later edit's form is under way
  if (data.error) { $("form-state").textContent = "form not updated: " + describe(data.error); markFieldErrors(); return; }
  $("form-state").textContent = data.resolved ? data.stage + " recipe" :
    data.stage + " recipe (values before defaults: the recipe does not validate yet)";
  const fresh = data.stage !== formStage;
  if (fresh) {
    $("form").replaceChildren(...data.sections.map((g) => groupNode(g)));
    formStage = data.stage;
  }
  fillForm(data.values, new Set(data.set), new Set(data.inherited || []), fresh);
  markFieldErrors();
}

function groupNode(group) {
  const box = node("details", null, "group");
  box.dataset.key = group.key;
  const summary = node("summary", group.name);
  if (group.help) summary.title = group.help;
  if (group.nullable) summary.append(node("small", " (optional)", "origin"));
  box.append(summary);
  for (const f of group.fields) box.append(f.kind === "group" ? groupNode(f) : fieldNode(f));
  return box;
}

function fieldNode(f) {
  const row = node("div", null, "field");
  row.dataset.key = f.key;
  row.dataset.kind = f.kind;
  const label = node("label");
  label.append(node("span", f.name, "name"));
  let input;
  if (f.kind === "readonly") {
    input = node("code", "", "readonly");
  } else if (f.kind === "enum") {
    input = node("select");
    const options = [...f.options, ...(f.nullable ? [null] : [])];
    for (const o of options) {
      const option = node("option", o === null ? "(none)" : String(o));
      option.value = JSON.stringify(o);
      input.append(option);
    }
  } else if (f.kind === "boolean") {
    input = node("input");
    input.type = "checkbox";
  } else {
    input = node("input");
    input.type = f.kind === "integer" || f.kind === "number" ? "number" : "text";
    if (f.kind === "integer") input.step = "1";
    if (f.kind === "number") input.step = "any";
    if (f.options && f.options.length) input.placeholder = f.options.map(String).join(" | ") + " or a value";
  }
  input.dataset.key = f.key;
  label.append(input, node("span", "", "origin"));
  row.append(label);
  if (f.help) row.append(node("small", f.help, "help"));
  if (f.note) row.append(node("small", f.note, "note"));
  row.append(node("div", "", "field-error"));
  if (f.kind !== "readonly") {
    input.addEventListener("change", () => setField(f, input, row));
  }
  row._field = f;
  return row;
}

function lookup(values, key) {
  let here = values;
  for (const part of key.split(".")) {
    if (here === null || typeof here !== "object" || !(part in here)) return undefined;
    here = here[part];
  }
  return here;
}

function fillForm(values, own, inherited, fresh) {
  for (const row of document.querySelectorAll("#form .field")) {
    const f = row._field;
    const value = lookup(values, f.key);
    const isSet = own.has(f.key);
    row.classList.toggle("set", isSet);
    row.querySelector(".origin").textContent = isSet ? "set here" : inherited.has(f.key) ? "from extends" :
      value === undefined ? "default " + JSON.stringify(f.default) : "default";
    const input = row.querySelector("[data-key]");
    if (input === document.activeElement) continue;  // being typed in
    const shown = value === undefined ? f.default : value;
    if (f.kind === "readonly") {
      input.textContent = shown === undefined || shown === null ? "(none)" : JSON.stringify(shown);
    } else if (f.kind === "enum") {
      const wanted = JSON.stringify(shown === undefined ? null : shown);
      if (![...input.options].some((o) => o.value === wanted)) {  // a value the schema does not list
        const option = node("option", String(shown) + " (not a choice)");
        option.value = wanted;
        input.append(option);
      }
      input.value = wanted;
    } else if (f.kind === "boolean") {
      input.checked = shown === true;
    } else {
      input.value = shown === undefined || shown === null ? "" : String(shown);
    }
  }
  if (fresh) {  // sections the file sets open at first; the rest stay folded
    for (const box of document.querySelectorAll("#form details.group")) {
      box.open = box.dataset.key === "" || own.has(box.dataset.key);
    }
  }
}

function fieldValue(f, input) {
  if (f.kind === "enum") return JSON.parse(input.value);
  if (f.kind === "boolean") return input.checked;
  if ((f.kind === "integer" || f.kind === "number") && input.value === "") return null;
  return input.value;  // text: the server types it by the field's schema
}

function fieldRow(key) {
  // An error's key names a field, or something inside one (data.datasets[0].path: the datasets field).
  let k = String(key).replace(/\[.*$/, "");
  while (k) {
    const row = document.querySelector('#form .field[data-key="' + CSS.escape(k) + '"]');
    if (row) return row;
    k = k.includes(".") ? k.slice(0, k.lastIndexOf(".")) : "";
  }
  return null;
}

function showFieldError(row, problem) {
  row.classList.add("invalid");
  const box = row.querySelector(".field-error");
  box.textContent = (box.textContent ? box.textContent + "\n" : "") + describe(problem);
  for (let up = row.parentElement; up && up.id !== "form"; up = up.parentElement) {
    if (up.tagName === "DETAILS") up.open = true;
  }
}

function markFieldErrors() {
  for (const row of document.querySelectorAll("#form .field.invalid")) {
    row.classList.remove("invalid");
    row.querySelector(".field-error").textContent = "";
  }
  for (const problem of lastProblems) {
    const row = problem.key ? fieldRow(problem.key) : null;
    if (row) showFieldError(row, problem);
  }
}

async function setField(f, input, row) {
  const data = await api("/api/set_key", {path: recipe, text: $("recipe-text").value, key: f.key,
                                           value: fieldValue(f, input)});
  if (data.error) {
    row.querySelector(".field-error").textContent = "";
    showFieldError(row, data.error);
    return;
  }
  $("recipe-text").value = data.text;
  $("save-state").textContent = data.text === savedText ? "" : "unsaved changes";
  renderGutter([]);
  scheduleCheck(0);
}

// ---- start ---------------------------------------------------------------------------------------------
makeCharts();
refreshRuns();
loadRecipes();
setInterval(refreshRuns, 2000);
setInterval(refreshDetail, 2000);
setInterval(pollMetrics, 1500);
