// Keep a dashboard page up to date: every few seconds fetch the same page
// and swap its live part (#live) for the fresh one. Nothing is swapped while
// a control inside it has the focus (a button about to be pressed would move
// under the pointer) or while the tab is hidden.
"use strict";

(function () {
  let live = document.getElementById("live");
  const status = document.getElementById("refresh-status");
  if (!live) {
    return;
  }
  const every = 1000 * Number(live.dataset.refreshSeconds || 5);

  function busy() {
    const focused = document.activeElement;
    return document.hidden || (focused !== null && live.contains(focused) && focused.matches("button, input, select, a"));
  }

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  async function refresh() {
    if (busy()) {
      return;
    }
    let response;
    try {
      response = await fetch(window.location.href, { credentials: "same-origin", cache: "no-store" });
    } catch (error) {
      say("cannot reach the dashboard, retrying");
      return;
    }
    if (response.redirected && new URL(response.url).pathname.endsWith("/login")) {
      // Logged out meanwhile (a rotated token): show the login form.
      window.location.assign(response.url);
      return;
    }
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html").getElementById("live");
    if (!response.ok || fresh === null) {
      say(response.status === 503 ? "database unavailable, retrying" : "refresh failed (" + response.status + "), retrying");
      return;
    }
    if (busy()) {
      return;
    }
    // What the person opened (the charts' numbers) stays open.
    for (const opened of live.querySelectorAll("details[open][id]")) {
      const again = fresh.querySelector("#" + CSS.escape(opened.id));
      if (again !== null) {
        again.open = true;
      }
    }
    live.replaceWith(fresh);
    live = fresh;
    say("updated " + new Date().toLocaleTimeString());
  }

  window.setInterval(refresh, every);
})();
