"""Screenshot a run's report.html in headless Chromium (the picture in the README).

    python scripts/report_screenshot.py RUN_DIR docs/img/report.png

RUN_DIR is a run's folder in a local store (`runs/<run_id>`); run `tailflow report RUN_ID` first if it has
no report.html. Needs Debian's chromium and chromium-driver (scripts/test.sh installs them) and selenium.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path


def screenshot(run_dir: Path, out: Path, width: int = 1500) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    page = (run_dir / "report.html").resolve()
    if not page.is_file():
        raise SystemExit(f"{page} does not exist: run `tailflow report RUN_ID` first")
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--window-size={width},900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(page.as_uri())
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, height + 100)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


if __name__ == "__main__":
    screenshot(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"wrote {sys.argv[2]}")
