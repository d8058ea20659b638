// The connection form shows only the credential fields of the chosen kind.
(() => {
  "use strict";
  const FIELDS = {
    api_key: ["header_name", "value"],
    bearer: ["token"],
    basic: ["username", "password"],
    oauth: ["access_token", "refresh_token"],
  };
  const ALL = Object.values(FIELDS).flat();

  function show() {
    const kind = document.getElementById("id_kind");
    if (!kind) return;
    const wanted = FIELDS[kind.value] || [];
    for (const name of ALL) {
      const row = document.querySelector(`.form-row.field-${name}`);
      if (row) row.hidden = !wanted.includes(name);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    const kind = document.getElementById("id_kind");
    if (kind) kind.addEventListener("change", show);
    show();
  });
})();
