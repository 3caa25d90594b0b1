// Prints explore.js's palette(n) for a theme palette (argv[2], JSON) and n (argv[3]): tests/test_render_layout.py.
const fs = require('fs');
const src = fs.readFileSync(require('path').join(__dirname, '..', 'src', 'gatherlens', 'render', 'templates', 'explore.js'), 'utf8');
const grab = (name) => { const i = src.indexOf('  function ' + name + '('); let depth = 0, j = src.indexOf('{', i); for (let k = j; k < src.length; k++) { if (src[k] === '{') depth++; if (src[k] === '}') { depth--; if (depth === 0) return src.slice(i, k + 1); } } };
const T = {palette: JSON.parse(process.argv[2])};
eval(grab('hslHex') + grab('palette') + '; global.P = palette;');
console.log(JSON.stringify(P(+process.argv[3])));
