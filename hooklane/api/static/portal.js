// The portal link's page: submit its form at once, which redeems the link
// for a session. Only a browser that runs this script (or a person who
// clicks) gets that far: a prefetcher or a mail scanner that fetches the
// page and stops leaves the single-use link unused.
"use strict";

(function () {
  const form = document.getElementById("enter");
  if (form) {
    form.submit();
  }
})();
