// The console follows the daemon through Server-Sent Events: on each update it fetches the part of the
// page it shows again (server-rendered and escaped) and swaps it in. No value is ever put into the page
// as HTML by this script except what the server rendered; countdowns tick locally.
"use strict";

(function () {
  const live = document.getElementById("live");
  const overview = document.getElementById("overview");

  function say(text) {
    if (live) live.textContent = text;
  }

  async function refresh() {
    if (!overview) return;
    const response = await fetch("/console/overview", { cache: "no-store" });
    if (!response.ok) return;
    const text = await response.text();
    // Parsed into an inert document: scripts in it never run (and the page's policy forbids inline ones).
    const parsed = new DOMParser().parseFromString("<div>" + text + "</div>", "text/html");
    overview.replaceChildren(...parsed.body.firstChild.childNodes);
  }

  function tick() {
    for (const el of document.querySelectorAll(".countdown")) {
      const left = Math.max(0, parseInt(el.textContent, 10) - 1);
      el.textContent = String(left);
    }
  }

  const events = new EventSource("/console/events");
  events.addEventListener("update", (e) => {
    say("live · generation " + e.data);
    refresh().catch(() => say("refresh failed"));
  });
  events.onerror = () => say("reconnecting…");
  setInterval(tick, 1000);
})();
