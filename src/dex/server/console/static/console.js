// The console's one script, on every page (its Content-Security-Policy runs no inline
// script): the log-in form and the error page's "Go back", then the session page, live.
(() => {
  "use strict";
  // a refused page keeps its own address: come back to it after logging in
  const next = document.querySelector(".login input[name=next]");
  if (next && !next.value && !location.pathname.endsWith("/login")) {
    next.value = location.pathname + location.search;
  }
  // "Go back" goes back where the refused form was (without script: to the inbox)
  for (const back of document.querySelectorAll(".error a.back")) {
    back.addEventListener("click", (event) => {
      if (history.length > 1) {
        event.preventDefault();
        history.back();
      }
    });
  }
})();

// The session page, live: the API's event stream shows the text of the model attempt that
// runs now as it streams, and any other event (a history item, a turn or wait event)
// renders the page's state and conversation again from the server. A lost connection (the
// server restarted) is opened again, and the page renders again once it answers: events
// missed meanwhile are in the state.
(() => {
  "use strict";
  const root = document.getElementById("session");
  if (!root) return;
  const box = document.getElementById("live-box");
  const live = document.getElementById("live");
  const from = document.getElementById("live-from");
  const banner = document.getElementById("connection");
  const held = document.getElementById("held"); // a render put off while a person types
  const REGIONS = ["state", "conversation", "turns"];
  let attempt = null; // the model attempt whose text the live box shows
  const discarded = new Set(); // attempts whose text is void: their late deltas are too
  let source = null;
  let refreshing = null;
  let retry = 250;

  function refreshSoon(delay = 50) {
    clearTimeout(refreshing);
    refreshing = setTimeout(refresh, delay);
  }

  function typing() {
    // a field a person is in, even empty (rendering the page again would pull it from
    // under their keys: what they type next goes nowhere), or one they filled and have
    // not sent yet, focused or not (a click on its button moves the focus before the
    // form is sent). The message box is in no region: a render leaves it as it is, so
    // what a person writes there holds nothing back.
    const fields = REGIONS.flatMap((id) => [
      ...document.getElementById(id).querySelectorAll("input:not([type=hidden]), textarea"),
    ]);
    return fields.some(
      (field) =>
        field === document.activeElement || (field.value && field.value !== field.defaultValue),
    );
  }

  function putOff() {
    held.hidden = false;
    refreshSoon(1000);
  }

  async function refresh() {
    if (typing()) return putOff(); // do not wipe what a person is typing
    let page;
    try {
      const answer = await fetch(location.href, { cache: "no-store", credentials: "same-origin" });
      if (!answer.ok) throw new Error(`status ${answer.status}`);
      page = new DOMParser().parseFromString(await answer.text(), "text/html");
    } catch (e) {
      banner.hidden = false;
      return refreshSoon(Math.min((retry *= 2), 2000));
    }
    banner.hidden = true;
    retry = 250;
    if (typing()) return putOff(); // they started typing while it loaded
    held.hidden = true;
    for (const id of REGIONS) {
      const fresh = page.getElementById(id);
      if (fresh) document.getElementById(id).replaceWith(fresh);
    }
    if (attempt && !isLive(attempt)) clear(); // it ended: its text is in the conversation
  }

  function isLive(attemptId) {
    // the rendered state says which text is not live any more: earlier turns', and
    // ended Steps' and attempts' of the turn that runs (the stream replays them all)
    const known = JSON.parse(document.getElementById("live-state").dataset.live);
    const [, stepId] = attemptId.split("/").slice(-2);
    const turn = Number(stepId.split(".")[0]);
    if (discarded.has(attemptId) || turn < known.turn) return false;
    return !(turn === known.turn && (known.ended_steps.includes(stepId) || known.ended.includes(attemptId)));
  }

  function clear(said = "") {
    attempt = null;
    live.textContent = "";
    from.textContent = said;
    box.hidden = !said;
  }

  function delta(event) {
    const data = JSON.parse(event.data);
    if (!isLive(data.attempt_id)) return; // old text, or a void attempt's
    if (data.attempt_id !== attempt) {
      attempt = data.attempt_id;
      live.textContent = "";
      from.textContent = `Step ${data.step_id}, attempt ${attempt.split("/").pop()}`;
    }
    box.hidden = false;
    live.textContent += data.text;
  }

  function discard(event) {
    // the attempt failed or was cancelled: its partial text is void, a retry streams anew
    const data = JSON.parse(event.data);
    discarded.add(data.attempt_id);
    if (data.attempt_id !== attempt) return;
    clear(`Step ${data.step_id}: attempt ${data.attempt_id.split("/").pop()} discarded`);
  }

  function connect() {
    clear(); // a new stream replays what the node still buffers
    source = new EventSource(root.dataset.events);
    source.addEventListener("model.delta", delta);
    source.addEventListener("model.discard", discard);
    // events were lost (stream.gap), or this page fell behind and the server let it go
    // (stream.dropped; the browser opens the stream again by itself): the state has them
    for (const type of ["history.item", "turn.started", "turn.completed", "turn.failed",
                        "turn.cancelled", "wait.started", "wait.ended", "budget.changed",
                        "message.queued", "stream.gap", "stream.dropped"]) {
      source.addEventListener(type, () => refreshSoon());
    }
    source.onopen = () => {
      banner.hidden = true;
      refreshSoon(); // anything that happened while no stream was open
    };
    source.onerror = () => {
      banner.hidden = false;
      if (source.readyState === EventSource.CLOSED) {
        // refused (a node still recovering answers 503): the browser gave up, try again
        setTimeout(connect, Math.min((retry *= 2), 2000));
      }
    };
  }

  connect();
})();
