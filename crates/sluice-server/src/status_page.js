// Redraws the status page from /status.json every 2 s, with the same structure as the
// server's rendering. Values are only ever put in text nodes and attributes (never parsed as
// markup): keys come from traffic.
(() => {
  const h = (tag, attrs, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    for (const k of kids) if (k !== null && k !== undefined) e.append(k instanceof Node ? k : String(k));
    return e;
  };
  const ago = (now, at) => {
    const s = Math.floor(Math.max(0, now - at) / 1000);
    if (s < 60) return `${s} s ago`;
    if (s < 3600) return `${Math.floor(s / 60)} min ago`;
    return `${Math.floor(s / 3600)} h ago`;
  };
  const f1 = (x) => Number(x).toFixed(1);
  const spark = (points) => {
    const ns = 'http://www.w3.org/2000/svg', w = 160, ht = 28;
    const svg = document.createElementNS(ns, 'svg');
    for (const [k, v] of Object.entries({ class: 'spark', width: w, height: ht, viewBox: `0 0 ${w} ${ht}`, role: 'img', 'aria-label': 'decisions per second, last minutes' })) svg.setAttribute(k, v);
    const max = points.reduce((m, p) => Math.max(m, p.allowed, p.denied), 1);
    const n = Math.max(points.length, 2) - 1;
    for (const [field, colour] of [['allowed', '#999'], ['denied', '#c0392b']]) {
      const line = document.createElementNS(ns, 'polyline');
      line.setAttribute('fill', 'none');
      line.setAttribute('stroke', colour);
      line.setAttribute('points', points.map((p, i) => `${(i * w / n).toFixed(1)},${(ht - p[field] / max * (ht - 2) - 1).toFixed(1)}`).join(' '));
      svg.append(line);
    }
    return svg;
  };
  const row = (cells, tag = 'td') => h('tr', {}, ...cells.map((c) => (c instanceof Node ? c : h(tag, {}, c))));
  const render = (s) => {
    const page = h('div', { id: 'page', 'data-from': 'status.json' });
    const head = h('p', {}, 'instance ', h('code', {}, s.node), `, up ${s.uptime_s} s; config `, h('code', {}, s.config.file), ` loaded ${ago(s.now_ms, s.config.loaded_at_ms)}`);
    const r = s.config.last_reload;
    if (r) head.append(`; last reload (${r.trigger}) ${ago(s.now_ms, r.at_ms)}: `, h('span', { class: r.ok ? 'ok' : 'bad' }, r.message));
    page.append(h('header', {}, h('h1', {}, 'Sluice ', h('small', {}, `${s.version} (commit ${s.commit}, built ${s.build_date})`)), head));
    const st = s.store, fl = st.flushes;
    const store = h('section', {}, h('h2', {}, 'Store'), h('table', {},
      row(['health', 'live instances', 'last flush', 'flush took', 'flushes ok / failed', 'clock offset', 'exact breaker', 'spill to replay'], 'th'),
      row([h('td', { class: st.health === 'answering' ? 'ok' : 'bad' }, st.health),
        st.fleet_instances === 0 ? '-' : st.fleet_instances,
        fl.last_at_ms === null ? 'never' : ago(s.now_ms, fl.last_at_ms),
        `${f1(fl.last_took_ms)} ms`, `${fl.answered} / ${fl.failed}`, `${f1(st.clock_offset_ms)} ms`,
        st.exact_breaker, st.replay_pending])));
    if (fl.last_error) store.append(h('p', {}, 'last flush failure: ', h('span', { class: 'bad' }, fl.last_error)));
    page.append(store);
    const doors = s.listeners || [];
    if (doors.length) {
      page.append(h('section', {}, h('h2', {}, 'Listeners'), h('table', {},
        row(['listener', 'state', 'shed: no slot', 'shed: waiting room full', 'body timeouts'], 'th'),
        ...doors.map((d) => row([d.listener,
          h('td', { class: d.shedding ? 'bad' : 'ok' }, d.shedding ? `shedding (last ${d.last_shed_ms_ago} ms ago)` : 'serving'),
          d.shed_in_flight, d.shed_waiting, d.body_timeouts])))));
    }
    const rules = h('section', {}, h('h2', {}, 'Rules'));
    s.rules.forEach((rule, i) => {
      const rates = s.rates[i] || { now: { allowed: 0, denied: 0, shadow_denied: 0 }, history: [] };
      const limit = rule.limit === null ? 'unlimited' : `${rule.limit} per ${rule.window_s} s`;
      const said = [rule.policy === rule.mode ? null : rule.policy, rule.note].filter((x) => x);
      const policy = said.length ? ` (${said.join('; ')})` : '';
      const title = h('h3', {}, h('code', {}, rule.domain), ` ${rule.id}`, rule.name ? ` (${rule.name})` : null, rule.shadow ? ' ' : null, rule.shadow ? h('em', {}, 'shadow') : null);
      const d = rule.decisions;
      const line = h('p', {}, `${rule.mode}${policy}, ${limit}; ${rule.tracked_keys} keys tracked here. Now: `,
        h('b', {}, f1(rates.now.allowed)), ' allowed/s, ', h('b', { class: 'bad' }, f1(rates.now.denied)),
        ` denied/s, ${f1(rates.now.shadow_denied)} shadow-denied/s (since started: ${d.allowed} allowed, ${d.denied} denied, ${d.shadow_denied} shadow-denied) `,
        spark(rates.history));
      const article = h('article', { class: 'rule' }, title, line);
      if (rule.heavy_keys.length === 0) {
        article.append(h('p', { class: 'quiet' }, 'no traffic sampled yet'));
      } else {
        const table = h('table', { class: 'keys' }, row(['heaviest keys', 'requests', rule.shadow ? 'would deny' : 'denied', 'used of limit', 'state'], 'th'));
        for (const k of rule.heavy_keys) {
          const used = k.used === null ? '-' : rule.limit === null ? `${k.used}` : `${k.used} / ${rule.limit}`;
          const near = k.used !== null && rule.limit !== null && k.used * 10 >= rule.limit * 8;
          // Shadow mode denies nothing: the key is over, and let through.
          const state = k.blocked && rule.shadow ? h('td', { class: 'warn' }, 'over limit (shadow: not denied)')
            : k.blocked ? h('td', { class: 'bad' }, 'blocked') : near ? h('td', { class: 'warn' }, 'near limit') : h('td', {}, 'ok');
          // A busy rule's counts come from a sample: marked as estimates.
          const about = k.estimated ? '~' : '';
          table.append(row([h('td', {}, h('code', {}, k.key)), `${about}${k.requests}`, `${about}${k.denied}`, used, state]));
        }
        article.append(table);
      }
      rules.append(article);
    });
    page.append(rules);
    return page;
  };
  setInterval(async () => {
    try {
      const r = await fetch('status.json', { credentials: 'same-origin', cache: 'no-store' });
      if (!r.ok) return;
      document.getElementById('page').replaceWith(render(await r.json()));
    } catch (e) { /* the next tick tries again */ }
  }, 2000);
})();
